"""The effect outbox on real ``celery worker`` (and ``celery beat``) processes, SQLite and Cosmos."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine.outbox import EffectRef, InlineSender
from celery_durable.errors import DurableTimeoutError
from celery_durable.glue.outbox import OUTBOX_SCAN_TASK
from celery_durable.stores.base import Op
from tests.apps import effects
from tests.plugins.workers import Worker, wait_until

pytestmark = pytest.mark.worker

BACKENDS = [
    pytest.param(("redis", "sqlite"), id="redis-sqlite"),
    pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
]
APP = "tests.apps.effects"
#: short leases and polls so failures are noticed within seconds
ENV = {
    "TEST_LEASE_TTL": "2",
    "TEST_HEARTBEAT": "0.5",
    "TEST_OUTBOX_CANCEL_POLL": "0.1",
    "TEST_OUTBOX_SCAN": "0.5",
    "TEST_OUTBOX_QUEUE_TIMEOUT": "3",
}


@dataclass
class Fx:
    cluster: Any

    @property
    def outbox(self) -> Any:
        return effects.durable.outbox

    @property
    def marks(self) -> Path:
        return Path(self.cluster.workers.tmp) / "marks"

    def worker(self, concurrency: int = 2, env: dict[str, str] | None = None) -> Worker:
        return self.cluster.workers.start(app=APP, concurrency=concurrency, env=ENV | (env or {}))  # type: ignore[no-any-return]

    def beat(self, env: dict[str, str] | None = None) -> Worker:
        return self.cluster.workers.start_beat(app=APP, env=ENV | (env or {}))  # type: ignore[no-any-return]

    def log(self) -> list[dict[str, Any]]:
        path = self.marks / "fx.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def runs(self, effect_id: str, event: str = "start") -> list[dict[str, Any]]:
        return [e for e in self.log() if e["id"] == effect_id and e["event"] == event]

    def wait(self, effect_id: str, timeout: float = 60.0) -> Any:
        try:
            return self.outbox.wait(effect_id, timeout=timeout)
        except DurableTimeoutError as exc:  # say why: the row, its key's head, what the workers did
            raise AssertionError(f"{exc}\n{self.diagnose(effect_id)}") from exc

    def diagnose(self, effect_id: str) -> str:
        """The row and its key's head as stored, the handler runs logged, and the workers' lines
        about the effect (worker logs stay in the test's tmp directory)."""
        row = self.outbox.core.get(effect_id)
        head = None if row is None else self.outbox.core.head(str(row["key"]))
        lines = [f"row: {row}", f"head: {head}", f"runs: {[e for e in self.log() if e['id'] == effect_id]}"]
        for worker in self.cluster.workers.workers:
            lines.append(f"--- {worker.name} ({worker.log_path}):")
            lines += [line for line in worker.log().splitlines() if effect_id in line or "Error" in line][-40:]
        return "\n".join(lines)

    def status(self, effect_id: str) -> str | None:
        info = self.outbox.get(effect_id)
        return None if info is None else info.status


@pytest.fixture
def fx(cluster: Any) -> Iterator[Fx]:
    app = effects.app
    app.conf.update(
        broker_url=cluster.broker,
        task_default_queue=cluster.queue,
        durable_lease_ttl=2.0,
        durable_heartbeat_interval=0.5,
        durable_outbox_queue_timeout=3.0,
        durable_outbox_cancel_poll=0.1,
        durable_outbox_retention=7 * 24 * 3600.0,
    )
    app._pool = None
    app.amqp._producer_pool = None
    effects.durable.configure(store=cluster.store_url)
    yield Fx(cluster)
    effects.durable.configure(store=None)


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_idempotent_enqueue_and_duplicate_messages_run_once(fx: Fx) -> None:
    fx.worker(concurrency=4)
    fx.worker(concurrency=4)
    first = fx.outbox.enqueue("fx.record", {"sleep": 0.3}, key="k", effect_id="once")
    again = fx.outbox.enqueue("fx.record", {"sleep": 0.3}, key="k", effect_id="once")
    assert first.created and not again.created
    sender = fx.outbox.core.sender
    for _ in range(10):  # the broker delivers the same row many times to 8 worker processes
        sender.send_effect(EffectRef("k", "once", "fx.record"))
    info = fx.wait("once")
    assert info.status == "succeeded" and info.attempt == 1
    time.sleep(0.5)  # let the duplicates land: they must all find the row settled
    assert len(fx.runs("once")) == 1


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_keys_run_concurrently_each_strictly_in_order(fx: Fx) -> None:
    fx.worker(concurrency=4)
    keys = ["k1", "k2", "k3"]
    for i in range(5):
        for k in keys:
            fx.outbox.enqueue("fx.record", {"sleep": 0.15}, key=k, effect_id=f"{k}-{i}")
    for k in keys:
        for i in range(5):
            assert fx.wait(f"{k}-{i}").status == "succeeded"
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    log = fx.log()
    for k in keys:
        for i in range(5):
            start = next(e["t"] for e in log if e["id"] == f"{k}-{i}" and e["event"] == "start")
            end = next(e["t"] for e in log if e["id"] == f"{k}-{i}" and e["event"] == "end")
            spans[k].append((start, end, f"{k}-{i}"))
    for k in keys:
        for (_, end, a), (start, _, b) in zip(spans[k], spans[k][1:], strict=False):
            assert start >= end, f"{b} started before {a} ended"
    # different keys overlapped in time
    everything = sorted(s for k in keys for s in spans[k])
    overlaps = sum(1 for x, y in zip(everything, everything[1:], strict=False) if y[0] < x[1])
    assert overlaps >= 3


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_cancel_stops_the_running_handler_and_wakes_the_key(fx: Fx) -> None:
    fx.worker(concurrency=2)
    fx.outbox.enqueue("fx.busy", {}, key="k", effect_id="busy")
    fx.outbox.enqueue("fx.record", {}, key="k", effect_id="next")
    wait_until(lambda: fx.runs("busy"), what="the busy handler to start")
    assert fx.status("next") == "pending"  # blocked behind the running row
    assert fx.outbox.cancel("busy", reason="operator") == 1
    assert fx.wait("next").status == "succeeded"
    wait_until(lambda: fx.runs("busy", "stopped"), timeout=10, what="the busy handler to be stopped")
    info = fx.outbox.get("busy")
    assert info.status == "cancelled" and info.reason == "operator"


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_cancel_between_execution_and_settle(fx: Fx) -> None:
    fx.worker(concurrency=2)
    fx.outbox.enqueue("fx.self_cancel", {}, key="k", effect_id="sc")
    fx.outbox.enqueue("fx.record", {}, key="k", effect_id="after")
    assert fx.wait("after").status == "succeeded"
    info = fx.wait("sc")
    assert info.status == "cancelled" and info.reason == "cancelled after execution"
    assert len(fx.runs("sc", "end")) == 1


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_process_loss_requeues_replay_safe_and_fails_process_bound(fx: Fx) -> None:
    gate = fx.marks.parent / "gate-loss"
    first = fx.worker(concurrency=2)
    fx.outbox.enqueue("fx.gate", {"path": str(gate)}, key="safe", effect_id="safe")
    fx.outbox.enqueue("fx.gate_bound", {"path": str(gate)}, key="bound", effect_id="bound")
    fx.outbox.enqueue("fx.record", {}, key="bound", effect_id="bound-next")
    wait_until(lambda: fx.runs("safe") and fx.runs("bound"), what="both handlers to start")
    first.kill()  # the worker dies mid-execution, holding both leases
    gate.write_text("open")
    fx.worker(concurrency=2)
    fx.beat()
    safe = fx.wait("safe", timeout=60)
    assert safe.status == "succeeded" and safe.attempt == 2
    bound = fx.wait("bound", timeout=60)
    assert bound.status == "failed" and "process-bound" in (bound.reason or "")
    assert fx.wait("bound-next").status == "succeeded"  # the failure unblocked its key
    assert len(fx.runs("bound")) == 1 and len(fx.runs("safe")) == 2


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_lease_lost_before_settle_settles_nothing(fx: Fx) -> None:
    gate = fx.marks.parent / "gate-lease"
    worker = fx.worker(concurrency=2)
    fx.outbox.enqueue("fx.gate", {"path": str(gate)}, key="k", effect_id="stolen")
    wait_until(lambda: fx.runs("stolen"), what="the handler to start")
    store = effects.durable.store
    for _ in range(20):  # another owner takes the row (the heartbeat may renew meanwhile: retry)
        row = store.read("fxq:k", "fx:stolen")
        body = {k: v for k, v in row.items() if k != "_etag"}
        body["lease"] = {"owner": "thief", "expires": time.time() + 3600}
        try:
            store.replace(body, if_match=row["_etag"])
            break
        except Exception:
            continue
    gate.write_text("open")
    wait_until(lambda: fx.runs("stolen", "end"), what="the handler to finish")
    wait_until(lambda: "'lease-lost'" in worker.log(), timeout=15, what="the delivery to report lease-lost")
    row = store.read("fxq:k", "fx:stolen")
    assert row["status"] == "running" and row["lease"]["owner"] == "thief"  # nothing was settled


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_settle_failure_requeues_replay_safe_and_terminalizes_process_bound(fx: Fx) -> None:
    fx.marks.mkdir(parents=True, exist_ok=True)
    (fx.marks / "fail-settle-safe1").write_text("x")
    (fx.marks / "fail-settle-bound1").write_text("x")
    fx.worker(concurrency=2, env={"DURABLE_STORE_URL": "flaky+" + fx.cluster.store_url})
    fx.outbox.enqueue("fx.record", {}, key="a", effect_id="safe1")
    fx.outbox.enqueue("fx.record_bound", {}, key="b", effect_id="bound1")
    safe = fx.wait("safe1")
    assert safe.status == "succeeded" and safe.attempt == 2
    assert len(fx.runs("safe1")) == 2  # replay-safe: ran again after the lost settle
    bound = fx.wait("bound1")
    assert bound.status == "failed" and "failed to settle a process-bound effect" in (bound.reason or "")
    assert len(fx.runs("bound1")) == 1


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_backoff_schedule_exhaustion_non_retryable_and_pruning(fx: Fx) -> None:
    fx.worker(concurrency=2, env={"TEST_OUTBOX_RETENTION": "2"})
    fx.outbox.enqueue("fx.flaky", {"failures": 3}, key="f", effect_id="flaky")
    fx.outbox.enqueue("fx.always", {}, key="a", effect_id="always")
    fx.outbox.enqueue("fx.declined", {}, key="d", effect_id="declined")
    flaky = fx.wait("flaky")
    assert flaky.status == "succeeded" and flaky.attempt == 4
    starts = [e["t"] for e in fx.runs("flaky")]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # min(30 s, 100 ms * 2^(n-1)), jittered into [d/2, d]
    for gap, expected in zip(gaps, [0.1, 0.2, 0.4], strict=True):
        assert expected / 2 - 0.02 <= gap < expected + 1.0, gaps
    always = fx.wait("always")
    assert always.status == "failed" and always.attempt == 3 and "ConnectionError" in (always.last_error or "")
    declined = fx.wait("declined")
    assert declined.status == "failed" and declined.attempt == 1
    # pruning after the retention (2 s here): settled rows go, failed rows stay
    wait_until(lambda: fx.outbox.scan().pruned or fx.outbox.get("flaky") is None, timeout=10, what="the prune")
    assert fx.outbox.get("flaky") is None
    assert fx.outbox.get("always").status == "failed"


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_transactional_enqueue_with_the_callers_documents(fx: Fx) -> None:
    fx.worker(concurrency=2)
    store = effects.durable.store
    order = {"pk": "order-7", "id": "order", "total": 42}
    assert fx.outbox.enqueue("fx.record", {}, key="orders", effect_id="tx-1", with_docs=[order]).created
    assert fx.wait("tx-1").status == "succeeded"
    assert store.read("order-7", "order")["total"] == 42
    assert store.read("order-7", "fxi:tx-1") is None  # the intent is gone once admitted
    # enqueue_ops in the caller's own batch; the batch fails: no effect exists
    ops = fx.outbox.enqueue_ops("order-7", "fx.record", {}, key="orders", effect_id="tx-2")
    with pytest.raises(Exception, match="exists"):
        store.batch("order-7", [Op.create({"pk": "order-7", "id": "order"}), *ops])
    assert fx.outbox.flush("order-7", ops) == 0 and fx.outbox.get("tx-2") is None
    # the batch commits: flush admits at once
    ops = fx.outbox.enqueue_ops("order-7", "fx.record", {}, key="orders", effect_id="tx-3")
    store.batch("order-7", [Op.create({"pk": "order-7", "id": "line-1", "sku": "a"}), *ops])
    assert fx.outbox.flush("order-7", ops) == 1
    assert fx.wait("tx-3").status == "succeeded"
    assert [r.id for r in fx.outbox.rows("orders")] == ["tx-1", "tx-3"]


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_emit_from_a_workflow_runs_exactly_once(fx: Fx) -> None:
    fx.worker(concurrency=2)
    h = effects.notify.start("ann", _workflow_id="notify-ann")
    for _ in range(3):  # duplicate drives: more replays of the emits
        effects.durable.engine.dispatcher.send_drive(h.id)
    first, second = h.result(timeout=60)
    assert (first, second) == ("notify-ann:000001", "notify-ann:000003")
    for eid in (first, second):
        assert fx.wait(eid).status == "succeeded"
    for _ in range(3):
        effects.durable.engine.dispatcher.send_drive(h.id)
    time.sleep(1.0)
    assert len(fx.runs(first)) == 1 and len(fx.runs(second)) == 1
    assert [r.id for r in fx.outbox.rows("notify-ann")] == [first, second]


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_a_reset_reruns_an_emit_as_a_new_effect(fx: Fx) -> None:
    """Issue 23 item 2: the re-run's emit at the old step is a new effect (id ``~1``), which runs;
    the old one ran once and is not run again."""
    fx.worker(concurrency=2)
    h = effects.reemit.start("r1", _workflow_id="reemit-r1")
    first = "reemit-r1:000001"
    assert fx.wait(first).status == "succeeded"
    h.cancel()
    wait_until(lambda: h.status() == "cancelled", timeout=30, what="the cancel")
    h.reset(step=1, reason="run it again")
    wait_until(lambda: fx.outbox.get(first + "~1") is not None, timeout=30, what="the re-run's emit")
    h.signal("go", "now")
    assert h.result(timeout=60) == first + "~1"
    assert fx.wait(first + "~1").status == "succeeded"
    time.sleep(0.5)
    assert len(fx.runs(first)) == 1 and len(fx.runs(first + "~1")) == 1
    assert [r.id for r in fx.outbox.rows("reemit-r1")] == [first, first + "~1"]


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_beat_resends_a_row_whose_message_was_lost(fx: Fx) -> None:
    # beat scans itself (durable_scans_in_beat): no scan task is scheduled for a worker
    assert OUTBOX_SCAN_TASK not in effects.app.conf.beat_schedule
    core = fx.outbox.core
    real, core.sender = core.sender, InlineSender()
    try:
        fx.outbox.enqueue("fx.record", {}, key="lost", effect_id="lost")  # its message goes nowhere
    finally:
        core.sender = real
    fx.worker(concurrency=2)
    time.sleep(1.0)
    assert fx.status("lost") == "pending"
    fx.beat()
    assert fx.wait("lost", timeout=30).status == "succeeded"


def test_cli_outbox_list_show_cancel_retry(fx: Fx) -> None:
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    def cli(*args: str) -> Any:
        return CliRunner().invoke(celery_cli, ["-A", APP, "durable", "outbox", *args])

    fx.worker()
    fx.outbox.enqueue("fx.always", effects.Rec(), key="cli-k", effect_id="cli-fail")
    assert fx.wait("cli-fail").status == "failed"
    gate = fx.marks / "cli-gate"
    fx.outbox.enqueue("fx.gate", effects.Gate(path=str(gate)), key="cli-k2", effect_id="cli-blocked")
    wait_until(lambda: fx.status("cli-blocked") == "running", what="the gated effect to run")

    listed = cli("list", "--key", "cli-k")
    assert listed.exit_code == 0, listed.output
    assert "cli-fail" in listed.output and "failed" in listed.output and "3/3" in listed.output
    shown = cli("show", "cli-fail")
    assert json.loads(shown.output)["status"] == "failed"
    assert cli("show", "nope").exit_code != 0

    cancelled = cli("cancel", "cli-blocked", "--yes")
    assert cancelled.exit_code == 0 and "cancelled 1" in cancelled.output
    assert fx.wait("cli-blocked").status == "cancelled"

    refused = cli("retry", "cli-blocked", "--yes")
    assert refused.exit_code != 0 and "not failed" in refused.output
    retried = cli("retry", "cli-fail", "--yes")
    assert retried.exit_code == 0 and "cli-fail:retry1" in retried.output
    assert fx.wait("cli-fail:retry1").status == "failed"  # it still fails: the service is down
    assert len(fx.runs("cli-fail:retry1")) == 3 and fx.status("cli-fail") == "failed"
