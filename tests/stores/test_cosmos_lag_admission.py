"""An enqueue that loses its lane write to another process's write, on Cosmos at Session
consistency (the test server's replica-lag mode): its re-reads may serve the version it lost
against for as long as the replica lags, which no token of the enqueuer covers. It used to spend
all its rounds at once on that stale version and raise "too contended" (seen in CI as a flake of
tests/integration/test_cosmos_lag.py, when a worker's claim landed between two enqueues)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_durable.engine.outbox.model import HEAD_ID, lane_pk, row_id
from celery_durable.stores.base import Store, reads_may_lag, strip_reserved
from celery_durable.testing.cosmos_server import CosmosTestServer
from tests.engine.outbox_env import Env
from tests.stores.lagging import lagging_pair

pytestmark = pytest.mark.cosmos

LAG_MS = 1200


@pytest.fixture
def two_processes(cosmos_server: CosmosTestServer) -> Iterator[tuple[Store, Store]]:
    with lagging_pair(cosmos_server, "lag_admission", LAG_MS) as pair:
        yield pair


@pytest.mark.foreign_documents  # a store test's own documents, not the engine's
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


def test_a_claim_whose_head_moved_meanwhile_waits_out_the_lag(two_processes: tuple[Store, Store]) -> None:
    """The worker's message carries the token of the row's enqueue; the client enqueued the key's
    next row meanwhile, so the head the worker reads (with that token) is stale for LAG_MS and its
    claim loses the etag race on every re-read. It used to spend all its rounds at once and answer
    "blocked", so nothing ran the row until beat's outbox scan (seen in CI:
    tests/integration/test_cosmos_lag.py, an effect still pending after 60 s)."""
    client, worker = two_processes
    env = Env(client)
    env.handler("fx.note")(lambda payload: None)
    lane = lane_pk("k")
    assert env.enqueue("fx.note", {"n": 0}, key="k", effect_id="e0").created
    token = client.session_token(lane)  # what the first row's message carries
    assert env.enqueue("fx.note", {"n": 1}, key="k", effect_id="e1").created  # moves the head
    worker.use_session_token(lane, token)
    result = Env(worker, clock=env.clock).outbox.claim("k", "e0")
    assert result.reason == "claimed", result
    assert result.claim is not None and result.claim.effect_id == "e0"


def test_a_settle_whose_head_moved_meanwhile_waits_out_the_lag(two_processes: tuple[Store, Store]) -> None:
    """The worker claimed the row (its own token covers that write); the client enqueued the
    key's next row meanwhile, so the worker's settle loses the etag race on the head and every
    re-read serves it the head of its claim for LAG_MS. It used to spend all its rounds at once
    and raise "too contended" with the row left running until its lease lapsed."""
    client, worker = two_processes
    env = Env(client)
    env.handler("fx.note")(lambda payload: None)
    lane = lane_pk("k")
    assert env.enqueue("fx.note", {"n": 0}, key="k", effect_id="e0").created
    worker.use_session_token(lane, client.session_token(lane))
    outbox = Env(worker, clock=env.clock).outbox
    claimed = outbox.claim("k", "e0")
    assert claimed.claim is not None, claimed
    assert env.enqueue("fx.note", {"n": 1}, key="k", effect_id="e1").created  # moves the head
    assert outbox.settle(claimed.claim, "succeeded") == "succeeded"
    assert (worker.read(lane, row_id("e0")) or {}).get("status") == "succeeded"
