"""Attacks on the outbox's ConflictPause under replica lag (Cosmos at Session consistency, the test
server's replica-lag mode): two "processes" are two store objects with their own session tokens."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from celery_durable.engine.outbox.model import ClaimResult, lane_pk
from celery_durable.stores.base import Store
from celery_durable.testing.cosmos_server import CosmosTestServer
from tests.engine.outbox_env import Env
from tests.stores.lagging import lagging_pair

pytestmark = pytest.mark.cosmos


@pytest.fixture(params=[300, 1000], ids=lambda ms: f"lag{ms}ms")
def lag_ms(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def two_processes(cosmos_server: CosmosTestServer, lag_ms: int) -> Iterator[tuple[Store, Store]]:
    with lagging_pair(cosmos_server, "lag_outbox_breaks", lag_ms) as pair:
        yield pair


class Stream:
    """The client enqueuing one row of key ``k`` every ``every`` seconds (a busy key) until stopped."""

    def __init__(self, env: Env, every: float) -> None:
        self.env, self.every, self.n = env, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.n += 1
            self.env.enqueue("fx.note", {"n": self.n}, key="k", effect_id=f"s{self.n}")
            self.stop.wait(self.every)

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_claim_on_a_key_enqueued_to_faster_than_the_lag_still_runs(
    two_processes: tuple[Store, Store], lag_ms: int
) -> None:
    """The worker's message carries the token of e0's enqueue; the client keeps enqueuing rows of
    the key (every lag/5). Every head the worker reads is older than the newest one, so its claim
    loses the etag race on every round: waiting out "the lag" never helps while the stream runs."""
    client, worker = two_processes
    env = Env(client)
    env.handler("fx.note")(lambda payload: None)
    lane = lane_pk("k")
    assert env.enqueue("fx.note", {"n": 0}, key="k", effect_id="e0").created
    worker.use_session_token(lane, client.session_token(lane))  # e0's message
    outbox = Env(worker, clock=env.clock).outbox
    results: list[ClaimResult] = []
    patience = max(3.0, 8 * lag_ms / 1000)  # far longer than a replica needs to catch up
    with Stream(env, lag_ms / 5000) as stream:
        claimer = threading.Thread(target=lambda: results.append(outbox.claim("k", "e0")), daemon=True)
        started = time.monotonic()
        claimer.start()
        claimer.join(patience)
        waited = time.monotonic() - started
        enqueued = stream.n
    claimer.join(120)
    assert results, "claim never returned"
    assert results[0].reason == "claimed"
    assert waited < patience, (
        f"e0's claim still looping after {waited:.1f} s while the client enqueued {enqueued} rows; "
        f"it only succeeded once the stream stopped"
    )
