"""DBOS's queue tests (dbos-transact-py tests/test_queue.py) on limited *workflows*: a DBOS queue
holds workflows, as ``@durable.workflow(limit=Limit(...))`` does, so these keep DBOS's scenarios
with the queue's workflows as executions: ``test_one_at_a_time``, ``test_limiter`` (a rate over
any window), ``test_priority_queue``, ``test_queue_partitions``,
``test_cancelling_queued_workflows``, ``test_queue_concurrency_under_recovery`` (a lost
release comes back), ``test_timeout_queue`` (a queued workflow's timeout counts from its start)
and ``test_queue_workflow_in_recovered_workflow`` (a recovered parent's queued children each run
once). Not ported: ``worker_concurrency`` (per process: Celery's ``worker -c``), queue CRUD and
versions (a limit is declared in code), deduplication (``options(dedup_key=…)``, tested in
tests/engine/test_dedup_property.py). The activity-limit versions: test_limits_dbos_ports.py.

One engine on a fake clock; each workflow waits for a ``go`` signal, so a test ends the ones it
chooses and "running at once" is the exec statuses, exact.
"""

from __future__ import annotations

from typing import Any

from celery_durable import Limit
from celery_durable import workflow as wf
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import WorkflowQueueing, limit_pk
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.starts.deadlines import Timing
from tests.engine.inprocess import InProcess


class World:
    def __init__(self, limit: Limit) -> None:
        self.w = InProcess()
        self.eng = self.w.engine
        self.ids: list[str] = []
        self.started: list[tuple[float, str]] = []
        self.eng.subscribe(self._on)

        def job(part: str, n: int) -> int:
            wf.wait_signal("go")
            return n

        self.job = self.w.registry.add_workflow("job", job, None, limit)

    def _on(self, event: str, **kw: Any) -> None:
        if event == "workflow_dequeued":
            self.started.append((self.w.clock.now(), str(kw["execution_id"])))

    def start(self, eid: str, part: str = "p", n: int = 0, priority: int | None = None, **timing: Any) -> str:
        q = WorkflowQueueing(priority=priority) if priority is not None else None
        self.eng.start(self.job, (part, n), {}, eid, queueing=q, timing=Timing(**timing) if timing else None)
        self.ids.append(eid)
        self.w.run()
        return eid

    def running(self) -> list[str]:
        return [e for e in self.ids if self.status(e) == "running"]

    def finish(self, eid: str) -> None:
        self.eng.signal(eid, "go", 1)
        self.w.run()

    def tick(self, seconds: float) -> None:
        self.w.clock.advance(seconds)  # type: ignore[attr-defined]
        self.eng.timers.fire_due_clocks()
        self.eng.recovery.scan()
        self.w.run()

    def status(self, eid: str) -> str:
        return str(self.eng.read_exec(eid)["status"])


def test_one_at_a_time() -> None:
    world = World(Limit("one", max_running=1))
    world.start("w1")
    world.start("w2")
    assert world.running() == ["w1"] and world.status("w2") == "queued"
    world.tick(60)  # later scans do not start the other
    assert world.running() == ["w1"]
    world.finish("w1")
    assert world.running() == ["w2"]
    world.finish("w2")
    assert [world.status(e) for e in world.ids] == ["completed", "completed"]


def test_limiter() -> None:
    """DBOS: 15 workflows with a limit of 5 starts per 1.8 s start in three waves, never more than
    5 in any window of 1.8 s, and the whole budget of a window is spent."""
    limit, period = 5, 1.8
    world = World(Limit("waves", rate="5/1.8s"))
    for i in range(15):
        world.start(f"w{i}", n=i)
    while len(world.started) < 15:
        for e in world.running():
            world.finish(e)  # each ends at once: only the rate holds the others back
        world.tick(0.1)
    times = sorted(t for t, _ in world.started)
    for i in range(len(times) - limit):
        assert times[i + limit] - times[i] >= period - 1e-9
    assert sum(1 for t in times if t < times[0] + period) == limit
    assert times[-1] - times[0] < 3 * (period + 0.2)
    for e in world.running():
        world.finish(e)
    assert all(world.status(e) == "completed" for e in world.ids)


def test_priority_queue() -> None:
    """DBOS: with one slot, workflows without a priority (0 here, the best) first, then by priority."""
    world = World(Limit("prio", max_running=1))
    world.start("first")
    for i, p in enumerate([None, 1, 2, 3, 4, 5, None, None]):
        world.start(f"w{i}", n=i, priority=p)
    world.finish("first")
    order = []
    while world.running():
        (eid,) = world.running()
        order.append(int(eid[1:]))
        world.finish(eid)
    assert order == [0, 6, 7, 1, 2, 3, 4, 5]


def test_queue_partitions() -> None:
    """A partition key gets its own limit: one running per partition, partitions side by side."""
    world = World(Limit("parts", max_running=1, key=lambda part, n: part))
    for i, part in enumerate(["a", "a", "b", "b", "c"]):
        world.start(f"w{i}", part, i)
    assert world.running() == ["w0", "w2", "w4"]
    while world.running():
        for e in world.running():
            world.finish(e)
    assert all(world.status(e) == "completed" for e in world.ids)


def test_cancelling_queued_workflows() -> None:
    """DBOS: cancelling queued workflows (and the running one) lets the next run; nothing is left
    holding or waiting."""
    world = World(Limit("cancel", max_running=1))
    for i in range(4):
        world.start(f"w{i}")
    assert world.eng.cancel("w1") and world.eng.cancel("w2")
    assert world.status("w1") == world.status("w2") == "cancelled"
    assert world.eng.cancel("w0")
    world.w.run()
    assert world.running() == ["w3"]
    world.finish("w3")
    doc = world.w.store.read(limit_pk({"name": "cancel", "key": ""}), LIMIT_DOC_ID)
    assert doc is not None and not doc["holders"] and not doc["waiters"]


def test_queue_concurrency_under_recovery() -> None:
    """A holder's release lost with its worker (killed between the end and the hand-off): after
    the holder's lease TTL the recovery scan frees the slot and the next workflow runs, never two
    at once."""
    world = World(Limit("recover", max_running=1))
    world.start("w0")
    world.start("w1")
    release = world.eng.limits.release_execution
    world.eng.limits.release_execution = lambda ex: None  # type: ignore[method-assign]
    world.finish("w0")
    world.eng.limits.release_execution = release  # type: ignore[method-assign]
    assert world.running() == []
    world.tick(world.eng.settings.lease_ttl + 1)
    assert world.running() == ["w1"]
    world.finish("w1")
    assert world.status("w1") == "completed"


def test_timeout_queue() -> None:
    """DBOS: a queued workflow's timeout starts when it is dequeued, not when it was enqueued."""
    world = World(Limit("timeouts", max_running=1))
    world.start("blocker")
    world.start("timed", timeout=10.0)
    world.tick(60)  # far past 10 s since its start(): still only queued
    assert world.status("timed") == "queued"
    world.finish("blocker")
    assert world.status("timed") == "running"
    world.tick(5)
    assert world.status("timed") == "running"
    world.tick(6)
    assert world.status("timed") == "timed_out"


def test_queue_workflow_in_recovered_workflow() -> None:
    """DBOS: a parent enqueues children and its worker dies; recovered, the parent's children are
    each started once (joined, not duplicated) and the parent gets all their results."""
    w = InProcess()

    def child(n: int) -> int:
        return n * 10

    cdef = w.registry.add_workflow("child", child, None, Limit("dbos-kids", max_running=2))

    def parent(count: int) -> list[int]:
        ctx = require_context("parent")
        return [f.result() for f in [ctx.start_child(cdef, (i,), {}, None) for i in range(count)]]

    pdef = w.registry.add_workflow("parent", parent)
    w.engine.start(pdef, (5,), {}, workflow_id="p")
    # the drive commits the child steps, but every message after it is lost (the worker died)
    kind, item = w.dispatcher.queue.popleft()
    assert kind == "drive"
    w.engine.drive(item)
    w.dispatcher.queue.clear()
    for _ in range(8):  # beat's scans, as long as it takes
        w.clock.advance(w.engine.settings.activity_queue_timeout + 1)  # type: ignore[attr-defined]
        w.engine.recovery.scan()
        w.run()
    assert w.status("p") == "completed"
    assert w.ex("p")["result"] == [0, 10, 20, 30, 40]
    children = [d for d in w.store.query_partition("p").docs if d.get("kind") == "child"]
    assert len({c["child_id"] for c in children}) == 5
