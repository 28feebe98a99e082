"""An enqueue that loses its lane write to another process's write, on Cosmos at Session
consistency (the test server's replica-lag mode): its re-reads may serve the version it lost
against for as long as the replica lags, which no token of the enqueuer covers. It used to spend
all its rounds at once on that stale version and raise "too contended" (seen in CI as a flake of
tests/integration/test_cosmos_lag.py, when a worker's claim landed between two enqueues)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_durable.engine.outbox.model import HEAD_ID, lane_pk
from celery_durable.stores import store_from_url
from celery_durable.stores.base import Store, reads_may_lag, strip_reserved
from celery_durable.testing.cosmos_server import CosmosTestServer
from tests.engine.outbox_env import Env

pytestmark = pytest.mark.cosmos

LAG_MS = 1200


@pytest.fixture
def two_processes(cosmos_server: CosmosTestServer) -> Iterator[tuple[Store, Store]]:
    url = cosmos_server.url_for("lag_admission", f"c{uuid.uuid4().hex[:12]}")
    client, worker = store_from_url(url), store_from_url(url)
    cosmos_server.set_replica_lag(LAG_MS)
    try:
        yield client, worker
    finally:
        cosmos_server.set_replica_lag(0)
        client.close()
        worker.close()


def test_an_enqueue_after_another_process_moved_the_head_waits_out_the_lag(two_processes: tuple[Store, Store]) -> None:
    client, worker = two_processes
    assert reads_may_lag(client)
    env = Env(client)
    env.handler("fx.note")(lambda payload: None)
    assert env.enqueue("fx.note", {"n": 0}, key="k", effect_id="e0").created
    # "the worker": another process (its own session) rewrites the lane's head, as a claim does
    lane = lane_pk("k")
    worker.use_session_token(lane, client.session_token(lane))  # its message carried the token
    head = worker.read(lane, HEAD_ID)
    assert head is not None
    worker.replace(strip_reserved(head) | {"touched": 1}, if_match=head["_etag"])
    # the client's next enqueue reads the head without the worker's token: stale for LAG_MS
    admitted = env.enqueue("fx.note", {"n": 1}, key="k", effect_id="e1")
    assert admitted.created
    live = [entry[1] for entry in (client.read(lane, HEAD_ID) or {}).get("live", [])]
    assert "e1" in live
