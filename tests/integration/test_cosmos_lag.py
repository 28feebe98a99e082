"""Workers on Cosmos DB with lagging replicas (issue 16): Session consistency, correct and prompt.

The ``cosmos-lag`` cluster runs the Cosmos test server's replica-lag mode: a read without a
session token at least as new as a document's last write sees the previous version (or none)
for 300 ms. Every delivery that follows a write must still find what the write wrote (the
message carries the writer's token), so nothing is dropped to wait for the recovery scan (which
these workers run only every 15 s, and never without beat).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic, effects
from tests.plugins.workers import Worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.cosmos]

LAGGING = [pytest.param(("redis", "cosmos-lag"), id="cosmos-lag")]

#: what a dropped or re-sent delivery logs (activity/effect "not run", drive "no such
#: execution", a timer "missing", the stale-read retry itself)
STALE_SIGNS = re.compile(
    r"not run: (no such|another attempt is running|the run is not yet|missing)"
    r"|no such execution|may be a stale read|missing \(retrying\)"
)


def _stale_signs(worker: Worker) -> list[str]:
    return [line for line in worker.log().splitlines() if STALE_SIGNS.search(line)]


@pytest.mark.parametrize("cluster", LAGGING, indirect=True)
def test_workflows_are_prompt_under_replica_lag(cluster: Any, cosmos_server: Any) -> None:
    worker = cluster.start_worker(concurrency=2)
    cosmos_server.reset_stats()
    began = time.monotonic()
    chain = basic.sum_chain.start(4)  # activities, each completion driving inline
    fan = basic.fan_out.start([basic.Item(sku=f"s{i}", qty=i) for i in range(3)])
    timer = basic.sleeper.start("lag", 0.5)  # a timer (fast path) then an activity
    waiting = basic.approval.start(60.0)  # a signal
    wait_until(lambda: cluster.durable.store.read(waiting.id, "s:000001"), what="the wait to be recorded")
    assert waiting.signal("approval", basic.Approval(ok=True, by="ops")) is True
    assert chain.result(timeout=60) == 6
    assert fan.result(timeout=60) == [f"box:s{i}x{i}" for i in range(3)]
    assert timer.result(timeout=60) >= 0
    assert waiting.result(timeout=60) == "ops:True"
    took = time.monotonic() - began
    # the lag bit (tokenless reads were served old versions) ...
    assert cosmos_server.stats()["staleReads"] > 0
    # ... yet no delivery was dropped or even retried because of it, and nothing waited for recovery
    assert _stale_signs(worker) == []
    assert took < 15.0, f"took {took:.1f} s: something waited for the recovery scan"


@pytest.fixture
def fx_app(cluster: Any) -> Any:
    app = effects.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    effects.durable.configure(store=cluster.store_url)
    yield effects.durable
    effects.durable.configure(store=None)


@pytest.mark.parametrize("cluster", LAGGING, indirect=True)
def test_outbox_effects_are_prompt_under_replica_lag(cluster: Any, fx_app: Any, cosmos_server: Any) -> None:
    worker = cluster.workers.start(app="tests.apps.effects", concurrency=1, env={"TEST_OUTBOX_SCAN": "30"})
    fx_app.outbox.enqueue("fx.record", {"sleep": 0.0}, key="warm", effect_id="warm-up")
    assert fx_app.outbox.wait("warm-up", timeout=60).status == "succeeded"  # connected: claims are quick
    cosmos_server.set_replica_lag(1000)  # longer than a message takes from the client to a claim
    cosmos_server.reset_stats()
    began = time.monotonic()
    ids = [f"lag-{k}-{i}" for k in range(4) for i in range(2)]
    for effect_id in ids:  # each key's first row is sent by the client, its second by the settle
        fx_app.outbox.enqueue("fx.record", {"sleep": 0.0}, key=effect_id.rsplit("-", 1)[0], effect_id=effect_id)
    for effect_id in ids:
        assert fx_app.outbox.wait(effect_id, timeout=60).status == "succeeded"
    took = time.monotonic() - began
    assert cosmos_server.stats()["staleReads"] > 0
    assert _stale_signs(worker) == []
    assert took < 15.0, f"took {took:.1f} s: something waited for the outbox scan"
    assert Path(cluster.workers.tmp, "marks", "fx.log").exists()


@pytest.mark.parametrize("cluster", LAGGING, indirect=True)
def test_a_message_without_a_token_is_retried_not_dropped(
    cluster: Any, cosmos_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old sender (no token): the drive finds no execution on the lagging replica, and is
    re-sent shortly until it does, instead of waiting for the recovery scan."""
    worker = cluster.start_worker(concurrency=1)
    assert basic.sum_chain.start(1).result(timeout=60) == 0  # connected: deliveries are quick
    cosmos_server.set_replica_lag(1000)
    monkeypatch.setattr("celery_durable.glue.tasks.session_headers", lambda app, pk: {})
    began = time.monotonic()
    h = basic.sum_chain.start(2)
    assert h.result(timeout=30) == 1
    assert time.monotonic() - began < 10.0
    retried = [line for line in worker.log().splitlines() if "may be a stale read, retrying" in line]
    assert retried, "the lag never made a delivery look stale: the test proves nothing"


@pytest.mark.parametrize("cluster", LAGGING, indirect=True)
def test_a_worker_at_info_does_not_log_every_cosmos_request(cluster: Any) -> None:
    """The chaos MISS on Cosmos (issue 16): at ``--loglevel=INFO`` azure-cosmos logged each request
    and response (~30 lines); with workers killed every 2 s that CPU pushed queue waits past the
    activity queue timeout. The worker logs its own lines only."""
    worker = cluster.start_worker(concurrency=1)
    assert basic.sum_chain.start(2).result(timeout=60) == 1
    log = worker.log()
    assert "activity tests.apps.basic.add" in log or "succeeded" in log  # it did log at INFO
    sdk = [line for line in log.splitlines() if "Request method:" in line or "Response status:" in line]
    assert sdk == [], f"{len(sdk)} SDK request/response lines, e.g. {sdk[:2]}"
