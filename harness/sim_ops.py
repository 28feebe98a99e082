"""Operator operations in the deterministic simulation (issue 23 item 3): reset, retry and resume
of finished executions by an operator process that may die at any store call.

Each seed adds a few ``w_fail`` workflows (they end failed) and schedules operator calls on the
planned executions: a failed one is retried or reset to a random step, a cancelled one resumed
or reset (a running or completed one is refused: counted, not a fault). The operator's store
wraps the shared :class:`~.sim_store.FaultyStore` (every call is observed and faulted as any
other) with a small ``max_batch_ops``, so a rewrite spans several batches, and with the
``abandon`` fault the operator process is killed at a random store call of the operation,
before or after it applied: nothing finishes what it began but whoever touches the execution
next (the driver, the recovery scan, the next operator call; engine/admin/pending_ops.py).

Invariant 8 (checked on every batch by the faulty store and at the end by ``sim_checks``):
a batch that deletes recorded documents of an execution leaves it reopened or records the rest
of the operation (never a terminal execution with a cut history and nothing saying so); a step
whose outcome such an unrecorded cut deleted never runs again; no operation is left pending
after healing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.engine.core import Engine
from celery_durable.errors import StoreError
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead, Store
from harness.sim_store import SETTINGS, Actor, SimClock, WorkerCrash

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module)
Sim = Any

__all__ = ["OPEN_BUG_TARGETS", "OPS_BATCH", "OperatorKilled", "plan_ops"]

#: the operator's batches: small, so that the workload's rewrites take several
OPS_BATCH = 4
#: operator calls planned per seed, at most; ``w_fail`` workflows added per seed, at most
MAX_CALLS, MAX_FAILING = 6, 2
#: resets and resumes of these end unlike a fault-free run even without faults: an open bug, so
#: they are targets only with its trigger (sim_catalog.KNOWN_BUGS["operator_compensations"]). Every
#: workflow that starts children is one (a cancel also cancels the children and a resume does not
#: revive them): w_generations as well as w_parent.
OPEN_BUG_TARGETS = ("w_saga", "w_parent", "w_generations")


class OperatorKilled(BaseException):  # noqa: N818 - control flow, like SystemExit
    """The operator's process died in the middle of an operation."""


class OperatorStore(Store):
    """The shared faulty store as the operator sees it: small batches, and a death at call ``kill_at``."""

    max_batch_ops = OPS_BATCH

    def __init__(self, shared: Store, kill_at: int | None, after: bool) -> None:
        self.inner = shared
        self.max_doc_bytes = shared.max_doc_bytes
        self.kill_at, self.after, self.calls = kill_at, after, 0

    def _go(self, fn: Any, *args: Any) -> Any:
        self.calls += 1
        dying = self.calls == self.kill_at
        if dying and not self.after:
            raise OperatorKilled(f"before store call {self.calls}")
        out = fn(*args)
        if dying:
            raise OperatorKilled(f"after store call {self.calls}")
        return out

    def read(self, pk: str, doc_id: str) -> Doc | None:
        return self._go(self.inner.read, pk, doc_id)  # type: ignore[no-any-return]

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        return self._go(self.inner.read_many, pk, ids)  # type: ignore[no-any-return]

    def create(self, doc: Doc) -> str | None:
        return self._go(self.inner.create, doc)  # type: ignore[no-any-return]

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return self._go(self.inner.replace, doc, if_match)  # type: ignore[no-any-return]

    def upsert(self, doc: Doc) -> str:
        return self._go(self.inner.upsert, doc)  # type: ignore[no-any-return]

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        return self._go(self.inner.delete, pk, doc_id, if_match)  # type: ignore[no-any-return]

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        return self._go(self.inner.query_partition, pk, since)  # type: ignore[no-any-return]

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        return self._go(self.inner.batch, pk, ops)  # type: ignore[no-any-return]

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        return self._go(self.inner.scan_due, kind, now, limit)  # type: ignore[no-any-return]

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        return self.inner.scan_partitions(pk_prefix, limit)

    def list_execs(self, flt: Any = None, limit: int = 100, cursor: str | None = None) -> Any:
        return self._go(self.inner.list_execs, flt, limit, cursor)


class _OperatorCall:
    """One operator call on ``eid`` (a client op of the scheduler: ``eid`` lets preemption pick it)."""

    def __init__(self, sim: Sim, eid: str, tries: int = 6) -> None:
        self.sim, self.eid, self.tries = sim, eid, tries

    def __call__(self) -> None:
        sim = self.sim
        rng = sim.rng
        kill_at = rng.randint(1, 8) if sim.faults_on and rng.random() < sim.faults.abandon else None
        actor = Actor(sim, "operator", 0.0, None)
        store = OperatorStore(sim.store, kill_at, rng.random() < 0.5)
        actor.engine = Engine(store, actor.dispatcher, sim.registry, SETTINGS, SimClock(sim, 0.0))
        actor.engine.identity = lambda: "operator"
        actor.engine.heartbeat.disable()
        sim.stack.append(actor)  # its store calls are the operator's (faults, preemption)
        try:
            self._operate(Admin(actor.engine))
        except (OperatorKilled, WorkerCrash):
            sim.count("ops_abandoned")  # nobody finishes it but the next to touch the execution
        except OperationRefused:
            sim.count("ops_refused")
        except StoreError:
            sim.count("ops_store_error")
            self._again()  # the operator tries again later (it may have been half applied)
        finally:
            sim.stack.pop()

    def _operate(self, admin: Admin) -> None:
        sim, rng = self.sim, self.sim.rng
        ex = sim.store.read(self.eid, "exec")
        status = None if ex is None else ex.get("status")
        if status not in ("failed", "cancelled"):
            self._again()
            return
        assert ex is not None
        steps = int(ex.get("steps") or 0)
        choice = rng.random()
        if choice < 0.5:
            sim.count("ops_reset")
            admin.reset(self.eid, rng.randint(1, steps + 1), by="sim", reason=f"seed {sim.seed}")
        elif status == "failed":
            sim.count("ops_retry")
            admin.retry(self.eid)
        else:
            sim.count("ops_resume")
            admin.resume(self.eid)
        sim.count("ops_returned")

    def _again(self) -> None:
        if self.tries > 1:
            sim = self.sim
            sim._op(sim.step + sim.rng.randint(5, 40), _OperatorCall(sim, self.eid, self.tries - 1))


def plan_ops(sim: Sim, only: tuple[str, list[Any]] | None) -> None:
    """Make the seed's plan (``Sim._make_plan``), then add failing workflows and operator calls."""
    sim._make_plan(only)
    if only is not None:
        return
    rng = sim.rng
    for i in range(rng.randint(0, MAX_FAILING)):
        sim._add(f"s{sim.seed}-f{i}-w_fail", "w_fail", [rng.randint(0, 4)], cancel=False, signals=0)
    skip = ("w_signal",) if "operator_compensations" in sim.known_bugs else ("w_signal", *OPEN_BUG_TARGETS)
    targets = [p.eid for p in sim.plan if p.workflow not in skip]
    for _ in range(rng.randint(0, MAX_CALLS)):
        sim._op(rng.randint(60, 320), _OperatorCall(sim, rng.choice(targets)))
    from harness.sim_dedup import plan_keyed  # it imports this module's OperatorStore

    plan_keyed(sim)  # starts with a dedup key (sim_dedup.py)
    from harness.sim_deadlines import plan_deadlined

    plan_deadlined(sim)  # starts with a deadline or a delay (sim_deadlines.py)
    from harness.sim_pause import plan_paused

    plan_paused(sim)  # pauses and unpauses of executions in flight (sim_pause.py)
    from harness.sim_updates import plan_updates

    plan_updates(sim)  # workflow updates, valid and rejected, racing continue-as-new (sim_updates.py)
    from harness.sim_batch import plan_batches

    plan_batches(sim)  # batch operations, run by the batch workflow (sim_batch.py)
