"""DBOS's queue tests (dbos-transact-py tests/test_queue.py) where they map onto keyed limits.

DBOS queues hold workflows; here a ``Limit`` holds activities, so each test keeps DBOS's scenario
and assertion with activity steps in the queue's place: ``test_one_at_a_time``,
``test_one_at_a_time_with_limiter``, ``test_limiter`` (a rate over any window),
``test_priority_queue``, ``test_queue_partitions`` (a partition key gets its own limit),
``test_partitioned_queue_does_not_starve_partitions`` (fairness between groups),
``test_cancelling_queued_workflows`` (nothing left holding a slot) and
``test_queue_concurrency_under_recovery`` (a lost holder's slot comes back). Not ported:
``worker_concurrency`` (per process: Celery's ``worker -c``), queue CRUD and versions (a limit is
declared in code), deduplication (``options(dedup_key=…)``, tests/engine/test_dedup_property.py).

The world is one engine on a fake clock whose activity messages are held in a list: a test
delivers them (``ActivityRunner.begin``), finishes the attempts it chooses and moves time, so
"running at once" is exact, not a matter of threads and sleeps.
"""

from __future__ import annotations

from typing import Any

from celery_durable import Limit
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.model import Attempt
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import limit_pk
from celery_durable.engine.replay.context import require_context
from tests.engine.inprocess import InProcess


class World:
    def __init__(self, limit: Limit, key_of: Any = None) -> None:
        self.w = InProcess()
        self.eng = self.w.engine
        self.act = self.w.registry.add_activity("job", lambda part, n: n, {"limit": limit})
        self.running: dict[tuple[str, int], Attempt] = {}
        self.started: list[tuple[float, str, int]] = []  # (time, execution, seq) of each begun attempt
        act = self.act

        def batch(parts: list[str], prios: list[int | None]) -> list[int]:
            ctx = require_context("batch")
            futures = []
            for i, (part, prio) in enumerate(zip(parts, prios, strict=True)):
                opts = dict(act.options) if prio is None else dict(act.options, priority=prio)
                futures.append(ctx.call_activity(act.name, act.codec, (part, i), {}, opts))
            return [f.result() for f in futures]

        self.batch = self.w.workflow(batch)

    def start(self, eid: str, parts: list[str], prios: list[int | None] | None = None) -> None:
        self.eng.start(self.batch, (parts, prios or [None] * len(parts)), {}, eid)
        self.pump()

    def pump(self) -> None:
        """Run drives; deliver every activity message (begin): the attempts that got a slot run."""
        q = self.w.dispatcher.queue
        while q:
            kind, item = q.popleft()
            if kind == "drive":
                self.eng.drive(item)
            elif kind == "activity":
                assert isinstance(item, ActivityRequest)
                attempt, _ = self.eng.activities.begin(item.execution_id, item.seq, item.run)
                if attempt is not None:
                    self.running[(item.execution_id, item.seq)] = attempt
                    self.started.append((self.w.clock.now(), item.execution_id, item.seq))

    def finish(self, eid: str, seq: int) -> None:
        a = self.running.pop((eid, seq))
        self.eng.activities.complete(a, self.eng.activities.result_doc(a, value=seq - 1))
        self.pump()

    def finish_all(self) -> None:
        while self.running:
            self.finish(*next(iter(self.running)))

    def tick(self, seconds: float) -> None:
        """Time passes (the running attempts' heartbeats renew their leases) and beat's recovery
        scan runs."""
        while seconds > 0:  # the heartbeat renews every 10 s (Settings.heartbeat_interval)
            step = min(seconds, self.eng.settings.heartbeat_interval)
            self.w.clock.advance(step)
            self.eng.leases.renew_all()
            seconds -= step
        self.eng.recovery.scan()
        self.pump()

    def kill(self, eid: str, seq: int) -> None:
        """The worker running it dies: never finished, never renewed, its slot never given back."""
        a = self.running.pop((eid, seq))
        a.limit = None
        self.eng.leases.untrack(a)

    def status(self, eid: str) -> str:
        return str(self.eng.read_exec(eid)["status"])


def test_one_at_a_time() -> None:
    world = World(Limit("one", max_running=1))
    world.start("e1", ["p", "p"])
    assert list(world.running) == [("e1", 1)]
    world.tick(60)  # later scans do not start the other
    assert list(world.running) == [("e1", 1)]
    world.finish("e1", 1)
    assert list(world.running) == [("e1", 2)]
    world.finish("e1", 2)
    assert world.status("e1") == "completed"


def test_one_at_a_time_with_limiter() -> None:
    world = World(Limit("one_rate", max_running=1, rate="10/s"))
    world.start("e1", ["p", "p"])
    world.tick(2)
    assert list(world.running) == [("e1", 1)]
    world.finish("e1", 1)
    assert list(world.running) == [("e1", 2)]
    world.finish_all()
    assert world.status("e1") == "completed"


def test_limiter() -> None:
    """DBOS: 15 tasks with a limit of 5 per 1.8 s go in three waves, never more than 5 in any
    window of 1.8 s, and the whole budget of a window is spent."""
    limit, period = 5, 1.8
    world = World(Limit("waves", rate="5/1.8s"))
    world.start("e1", ["p"] * 15)
    while len(world.started) < 15:
        world.finish_all()  # each finishes at once: only the rate holds them back
        world.tick(0.1)
    times = sorted(t for t, _, _ in world.started)
    for i in range(len(times) - limit):
        assert times[i + limit] - times[i] >= period - 1e-9
    assert sum(1 for t in times if t < times[0] + period) == limit
    assert times[-1] - times[0] < 3 * (period + 0.2)  # no stall beyond a scan interval a wave
    world.finish_all()
    assert world.status("e1") == "completed"


def test_priority_queue() -> None:
    """DBOS: with one slot, steps without a priority (0 here, the best) first, then by priority."""
    world = World(Limit("prio", max_running=1))
    world.start("e1", ["p"] * 8, [None, 1, 2, 3, 4, 5, None, None])
    order = []
    while world.running or len(order) < 8:
        (eid, seq) = next(iter(world.running))
        order.append(seq - 1)
        world.finish(eid, seq)
    assert order == [0, 6, 7, 1, 2, 3, 4, 5]


def test_queue_partitions() -> None:
    """A partition key gets its own limit: one running per partition, partitions side by side."""
    world = World(Limit("parts", max_running=1, key=lambda part, n: part))
    world.start("e1", ["a", "a", "b", "b", "c"])
    assert sorted(s for _, s in world.running) == [1, 3, 5]
    world.finish_all()
    assert world.status("e1") == "completed"


def test_partitioned_queue_does_not_starve_partitions() -> None:
    """One limit (2 at once) shared by partitions taking turns (``fair_by``): 4 small partitions
    with one step each are served while the 2 busy ones (60 steps each) still have a backlog."""
    world = World(Limit("shared", max_running=2, fair_by=lambda part, n: part))
    busy = ["aaa-busy-1", "aaa-busy-2"]
    small = [f"zzz-small-{i}" for i in range(4)]
    world.start("busy", [busy[i % 2] for i in range(120)])
    world.start("small", small)
    done: dict[str, int] = {}
    parts = {("busy", i + 1): busy[i % 2] for i in range(120)} | {("small", i + 1): p for i, p in enumerate(small)}
    while not all(done.get(p) for p in small):
        eid, seq = next(iter(world.running))
        done[parts[(eid, seq)]] = done.get(parts[(eid, seq)], 0) + 1
        world.finish(eid, seq)
    assert sum(done.get(p, 0) for p in busy) < 120 // 2


def test_cancelling_queued_workflows() -> None:
    """Cancelling a workflow whose steps wait (and one holds the slot) leaves no slot held: the
    next workflow's steps run."""
    world = World(Limit("cancel", max_running=1))
    world.start("e1", ["p", "p", "p"])
    world.start("e2", ["p"])
    assert list(world.running) == [("e1", 1)]
    assert world.eng.cancel("e1")
    world.pump()
    world.finish_all()  # e1's running step ends (its outcome no longer matters)
    world.tick(1)
    while world.running:
        world.finish_all()
        world.tick(1)
    assert world.status("e2") == "completed"
    doc = world.w.store.read(limit_pk({"name": "cancel", "key": ""}), LIMIT_DOC_ID)
    assert doc is not None and not doc["holders"] and not doc["waiters"]


def test_queue_concurrency_under_recovery() -> None:
    """A holder lost with its worker (its attempt never ends, its step lease lapses): after the
    lease TTL the recovery scan frees the slot, the step is re-sent and everything completes with
    never more than one running."""
    world = World(Limit("recover", max_running=1))
    world.start("e1", ["p", "p"])
    world.kill("e1", 1)
    world.tick(world.eng.settings.lease_ttl + 1)  # the lease lapses: the scan frees the slot
    assert len(world.running) <= 1
    world.tick(world.eng.settings.activity_queue_timeout + 1)
    assert len(world.running) == 1
    while world.running:
        world.finish_all()
        world.tick(world.eng.settings.lease_ttl + 1)
    assert world.status("e1") == "completed"
