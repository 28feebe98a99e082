"""Regressions of issue 10: stale partition caches (bug 3), a store outage while recording an
activity's retry (bug 5), duplicate deliveries to one process (bug 6), LeaseKeeper keys.

Two "processes" are two engines (each with its own PartitionCache) over one store.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_durable import Durable, durable_activity
from celery_durable.cli.commands import durable as durable_cli
from celery_durable.engine import Engine, Registry
from celery_durable.engine.activities.attempts import Attempt
from celery_durable.engine.documents.model import SystemClock
from celery_durable.engine.drive import seals
from celery_durable.engine.drive.partition_cache import bump_generation
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.durable_activity import DURABLE_HEADER
from celery_durable.stores.base import Op
from celery_durable.stores.memory import MemoryStore
from tests.engine.inprocess import InProcess


class Worker(InProcess):
    """One worker process: its own engine (and so its own cache) on a shared store, real time."""

    def __init__(self, store: MemoryStore, registry: Registry | None = None) -> None:
        super().__init__(store, registry, clock=SystemClock())


def _cli(worker: Worker, *args: str) -> Any:
    """Run the real click command in a 'CLI process': its own engine, messages to ``worker``."""
    app = Celery("cli", set_as_current=False)
    d = Durable(app, store=worker.store)
    d._engine = Engine(worker.store, worker.dispatcher, worker.registry)
    out = CliRunner().invoke(durable_cli, [*args, "--yes"], obj=types.SimpleNamespace(app=app))
    assert out.exit_code == 0, out.output
    return out


# --- bug 3: the partition cache never saw deletions -----------------------------------------


def test_cli_retry_reruns_the_step_in_a_worker_that_cached_the_failure() -> None:
    w = Worker(MemoryStore())
    fixed = {"v": False}
    runs: list[bool] = []

    @w.activity
    def needs_fix(x: int) -> int:
        runs.append(fixed["v"])
        if not fixed["v"]:
            raise RuntimeError("not fixed yet")
        return x

    def flow() -> int:
        return int(needs_fix(7))

    eid, _ = w.engine.start(w.registry.add_workflow("flow", flow), (), {}, workflow_id="job-1")
    w.run()
    assert w.engine.read_exec(eid)["status"] == "failed"
    assert w.engine.drive(eid) == "terminal"  # a duplicate drive message: the worker caches the failure
    assert "r:000001" in w.engine.cache.load(eid)
    fixed["v"] = True
    _cli(w, "retry", eid)
    w.run()
    ex = w.engine.read_exec(eid)
    assert runs == [False, True]
    assert (ex["status"], ex["result"]) == ("completed", 7)


@pytest.mark.parametrize("redrive", [True, False])
def test_purge_then_reusing_the_id_runs_the_new_execution(redrive: bool) -> None:
    w = Worker(MemoryStore())
    runs: list[int] = []

    @w.activity
    def price(day: int) -> int:
        runs.append(day)
        return 100 * day

    def quote(day: int) -> int:
        return int(price(day))

    d = w.registry.add_workflow("quote", quote)
    w.engine.start(d, (1,), {}, workflow_id="q")
    w.run()
    if redrive:  # a duplicate drive refreshes the worker's cache before the purge
        w.engine.drive("q")
    assert "purged 1" in _cli(w, "purge", "--older-than", "0s").output
    assert [doc["id"] for doc in w.store.query_partition("q").docs] == ["purged"]  # its record only
    w.engine.start(d, (2,), {}, workflow_id="q")
    w.run()
    ex = w.store.read("q", "exec")
    assert ex is not None
    assert (ex["status"], ex["result"], runs) == ("completed", 200, [1, 2])


def test_cache_rereads_when_the_generation_changes() -> None:
    w = Worker(MemoryStore())

    @w.activity
    def one() -> int:
        return 1

    def flow() -> int:
        return int(one())

    eid, _ = w.engine.start(w.registry.add_workflow("flow", flow), (), {}, workflow_id="g")
    w.run()
    ex = w.engine.cache.load(eid)["exec"]
    assert "r:000001" in w.engine.cache.load(eid)
    assert isinstance(ex.get("incarnation"), str) and ex.get("generation") == 0
    # an admin operation deletes a recorded result and bumps the generation in the same batch
    w.store.batch(eid, [Op.delete("r:000001"), Op.replace(bump_generation(ex), ex["_etag"])])
    docs = w.engine.cache.load(eid)
    assert "r:000001" not in docs
    assert docs["exec"]["generation"] == 1


def _running_execution(w: Worker) -> str:
    @w.activity
    def slow() -> int:
        return 1

    def flow() -> int:
        return int(slow())

    eid, _ = w.engine.start(w.registry.add_workflow("flow", flow), (), {}, workflow_id="gone")
    w.dispatcher.run_some(1)  # first drive: the activity is scheduled, not run
    return eid


def test_drive_of_a_deleted_execution_does_not_act_on_the_cached_copy() -> None:
    store = MemoryStore()
    w = Worker(store)
    eid = _running_execution(w)
    attempt, why = w.engine.activities.begin(eid, 1)  # the worker's cache holds the partition
    assert attempt is not None, why
    for doc in store.query_partition(eid).docs:  # deleted behind the worker's back
        store.delete(eid, doc["id"])
    before = dict(store.calls)
    # the activity completes: its result must not be recorded into a partition that is gone
    assert w.engine.activities.complete(attempt, w.engine.activities.result_doc(attempt, value=1)) == "missing"
    spent = sum(store.calls.values()) - sum(before.values())
    assert spent <= 6, store.calls  # no loop of conflicting commits
    assert store.query_partition(eid).docs == []


def test_begin_on_a_deleted_execution_does_not_loop() -> None:
    store = MemoryStore()
    w = Worker(store)
    eid = _running_execution(w)
    w.engine.cache.load(eid)
    for doc in store.query_partition(eid).docs:
        store.delete(eid, doc["id"])
    attempt, why = w.engine.activities.begin(eid, 1)
    assert attempt is None and why == "no such execution"
    assert store.query_partition(eid).docs == []


# --- bug 6: the step lease identified the process, not the attempt ---------------------------


def test_duplicate_delivery_to_the_same_process_is_refused() -> None:
    w = Worker(MemoryStore())
    eid = _running_execution(w)
    first, why = w.engine.activities.begin(eid, 1)
    assert first is not None, why
    second, why = w.engine.activities.begin(eid, 1)  # same process, same engine
    assert second is None and why.startswith("another attempt is running")
    assert first.holder.startswith(w.engine.identity() + ":")
    marker = w.store.read(eid, "s:000001")
    assert marker is not None and marker["attempts"] == 1 and marker["lease"]["holder"] == first.holder


def test_duplicate_delivery_on_another_thread_runs_once() -> None:
    w = Worker(MemoryStore())
    started, release = threading.Event(), threading.Event()
    executions: list[str] = []

    @w.activity
    def charge(cents: int) -> str:
        executions.append(threading.current_thread().name)
        started.set()
        release.wait(5)
        return f"charged {cents}"

    def flow() -> str:
        return str(charge(500))

    eid, _ = w.engine.start(w.registry.add_workflow("flow", flow), (), {}, workflow_id="pay")
    w.dispatcher.run_some(1)
    kind, req = w.dispatcher.queue.popleft()
    assert kind == "activity"
    t1 = threading.Thread(target=w.worker._activity, args=(req,))
    t1.start()
    assert started.wait(5)
    w.worker._activity(req)  # the duplicate, on this thread, while t1 still runs
    release.set()
    t1.join(5)
    w.run()
    assert len(executions) == 1
    assert w.engine.read_exec(eid)["result"] == "charged 500"


def test_heartbeat_renews_and_shutdown_releases_the_attempt_lease() -> None:
    w = Worker(MemoryStore())
    eid = _running_execution(w)
    attempt, why = w.engine.activities.begin(eid, 1)
    assert attempt is not None, why
    expires = w.store.read(eid, "s:000001")["lease"]["expires"]
    w.engine.clock = types.SimpleNamespace(now=lambda: expires)  # type: ignore[assignment]
    assert w.engine.leases.renew(attempt)
    assert w.store.read(eid, "s:000001")["lease"]["expires"] > expires
    w.engine.leases.stop(release=True)
    assert w.store.read(eid, "s:000001")["lease"] is None
    again, why = w.engine.activities.begin(eid, 1)  # the re-sent step can start at once
    assert again is not None and again.holder != attempt.holder, why


# --- LeaseKeeper keys ------------------------------------------------------------------------


def test_lease_keeper_keys_attempts_by_run_and_attempt() -> None:
    w = Worker(MemoryStore())
    keeper = w.engine.leases
    keeper.stop(release=False)
    run0 = Attempt("e", 3, "a", "1", "h:0", 1, run=0)
    run1 = Attempt("e", 3, "a", "2", "h:1", 1, run=1)
    twin = Attempt("e", 3, "a", "3", "h:2", 2, run=1)
    for a in (run0, run1, twin):
        keeper.track(a)
    keeper.stop(release=False)
    assert {a.holder for a in keeper.running()} == {"h:0", "h:1", "h:2"}
    keeper.untrack(run1)
    assert {a.holder for a in keeper.running()} == {"h:0", "h:2"}


# --- bug 5: a store outage while recording a retry dropped the outcome -----------------------


class FlakyStore(MemoryStore):
    """Down while ``down`` is set, or for the next ``outage`` calls."""

    down = False
    outage = 0

    def _check(self) -> None:
        if self.outage > 0:
            self.outage -= 1
            raise StoreUnavailable("store down (injected)")
        if self.down:
            raise StoreUnavailable("store down (injected)")

    def read(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().read(*a, **k)

    def read_many(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().read_many(*a, **k)

    def create(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().create(*a, **k)

    def replace(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().replace(*a, **k)

    def batch(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().batch(*a, **k)

    def query_partition(self, *a: Any, **k: Any) -> Any:
        self._check()
        return super().query_partition(*a, **k)


def test_retrying_with_the_store_down_does_not_raise() -> None:
    store = FlakyStore()
    w = Worker(store)
    eid = _running_execution(w)
    attempt, why = w.engine.activities.begin(eid, 1)
    assert attempt is not None, why
    store.down = True
    w.engine.activities.retrying(attempt, 1.0, RuntimeError("boom"))  # must not raise
    assert attempt not in w.engine.leases.running()


def _celery_app(store: FlakyStore, name: str, runs: list[int]) -> tuple[Durable, Any]:
    app = Celery(name, broker="memory://", set_as_current=False)
    durable = Durable(app, store=store)

    @durable_activity(name=f"{name}.charge")
    def charge(cents: int) -> str:
        runs.append(cents)
        store.down = True  # the store goes down while the activity runs
        return f"charged {cents}"

    @durable.workflow(name=f"{name}.flow")
    def flow() -> str:
        return str(charge(100))

    flow.start(_workflow_id="K")
    durable.engine.drive("K")  # step 1 scheduled (its message is not consumed here)
    return durable, app.tasks[f"{name}.charge"]


def test_store_outage_while_recording_keeps_the_outcome() -> None:
    """Eager ``apply`` runs the retry at once, like a worker receiving the retry message."""
    store = FlakyStore()
    runs: list[int] = []
    durable, task = _celery_app(store, "reg_k", runs)
    leases = durable.engine.leases
    real_release = leases.release

    def release_then_recover(attempt: Attempt) -> None:
        real_release(attempt)  # fails: the store is down, the attempt keeps its lease
        store.down = False  # the outage ends before the retry message arrives

    leases.release = release_then_recover  # type: ignore[method-assign]
    token = store.read("K", "s:000001")["token"]  # what the dispatcher's message carries
    res = task.apply(args=[100], headers={DURABLE_HEADER: {"e": "K", "s": 1, "r": 0, "w": "reg_k.flow", "t": token}})
    assert res.state == "SUCCESS", res.traceback
    assert runs == [100]  # the retry recorded the outcome it carried: no second run
    result = store.read("K", "r:000001")
    assert result is not None and result["value"] == "charged 100"
    assert store.read("K", "exec")["status"] == "completed"


def test_store_outage_at_the_start_of_a_retry_carrying_an_outcome_keeps_it() -> None:
    store = FlakyStore()
    runs: list[int] = []
    durable, task = _celery_app(store, "reg_k2", runs)
    outcome = {"pk": "K", "id": "r:000001", "type": "result", "run": 0, "seq": 1, "name": "reg_k2.charge"}
    outcome.update(ok=True, value="charged 100", attempts=1, completed_at=0.0)
    token = store.read("K", "s:000001")["token"]
    sealed = seals.seal_outcome(store, ("K", 0, 1), token, outcome)  # as the hand-off seals it
    seals._keys.clear()  # a fresh process: the key is read again (the store is down for that read)
    store.outage = 1  # the retry's first store call fails
    meta = {"e": "K", "s": 1, "r": 0, "w": "reg_k2.flow", "t": token, "sealed": sealed}
    res = task.apply(args=[100], headers={DURABLE_HEADER: meta})
    assert res.state == "SUCCESS", res.traceback
    assert runs == []
    assert store.read("K", "exec")["result"] == "charged 100"
