"""Deadlines and delayed starts in the deterministic simulation (issue 26 §4).

Each seed plans a few starts with ``options(timeout=, start_delay=)`` (engine/starts/deadlines.py)
of workflows that sleep, run activities, compensate (``w_saga``) or start children
(``w_parent``: a child's deadline is capped by its parent's), some cancelled by the client, some
cancelled while still ``scheduled``. They run through the same faults as the rest of the
workload: lost, duplicated and delayed messages, crashes, store errors, preemption.

Invariant 11: once the faults stop, every clock scan enforces every deadline that has passed on
its worker's clock (the execution has ended or is marked ``timed_out``: :func:`check_enforced`,
after each scan of the healing phase); a timeout is never recorded before the deadline, a delayed
execution takes no step before its start, and a timed-out saga released what it reserved
(:func:`check_ended`, at the end). Invariant 1 allows ``timed_out`` as their outcome.
"""

from __future__ import annotations

from typing import Any

from celery_durable.engine.documents.model import EXEC_ID, TERMINAL
from celery_durable.engine.starts.deadlines import Timing
from harness.sim_store import Actor, Planned

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module)
Sim = Any

__all__ = ["MAX_DEADLINED", "plan_deadlined", "check_enforced", "check_ended", "TIMED_OUT"]

#: deadlined or delayed starts planned per seed, at most
MAX_DEADLINED = 3
#: the outcome (sim_checks.outcome_of) of an execution ended by its deadline
TIMED_OUT = ("timed_out",)
#: the largest clock skew of a simulated process either way (sim.Sim's workers: ±0.4 s)
SKEW = 0.5


def plan_deadlined(sim: Sim) -> None:
    """Plan them on one seed in three (``seed % 3 == 0``): the other seeds run exactly as they did
    before deadlines existed (no draw of the seed's rng here), so a seed that catches a planted
    bug of another feature (tests/sim/test_harness_can_fail.py: some are caught by one seed in
    hundreds) still does."""
    if sim.seed % 3:
        return
    rng = sim.rng
    for n in range(rng.randint(0, MAX_DEADLINED)):
        kind = rng.choice(["w_saga", "w_timer", "w_parent", "w_seq"])
        args: list[Any]
        if kind == "w_saga":
            args = [f"d{n}"]
        elif kind == "w_timer":
            args = [rng.choice([5.0, 20.0, 45.0])]
        elif kind == "w_parent":
            args = [[rng.randint(0, 3) for _ in range(rng.randint(1, 3))]]
        else:
            args = [rng.randint(2, 4)]
        timeout = rng.choice([None, 15.0, 40.0, 90.0])
        delay = rng.choice([0.0, 0.0, 10.0, 30.0])
        if timeout is None and not delay:
            timeout = 40.0
        sim._add(f"s{sim.seed}-d{n}-{kind}", kind, args, cancel=rng.random() < 0.2, signals=0)
        sim.plan[-1].timing = Timing(timeout, delay)


def check_enforced(sim: Sim, scanner: Actor) -> None:
    """After a fault-free clock scan by ``scanner``: every deadline past on its clock is enforced."""
    now = scanner.engine.clock.now()
    for p in sim.plan:
        if p.timing is None or p.timing.timeout is None:
            continue
        ex = sim.inner.read(p.eid, EXEC_ID)
        at = None if ex is None else ex.get("deadline_at")
        if ex is None or not isinstance(at, int | float) or at > now:
            continue
        if ex.get("status") not in TERMINAL and not ex.get("timed_out"):
            late = f"{now - at:.1f}s past its deadline"
            sim.violate(11, f"{p.eid} is {ex.get('status')} {late}, after a clock scan with no faults")


def check_ended(sim: Sim, p: Planned, ex: dict[str, Any]) -> None:
    """At the end: no timeout before the deadline, no step before a delayed start."""
    docs = {d["id"]: d for d in sim.inner.query_partition(p.eid).docs}
    at = ex.get("deadline_at")
    for d in docs.values():
        err = d.get("error") if d.get("type") == "result" else None
        if isinstance(err, dict) and err.get("type") == "WorkflowTimedOutError" and isinstance(at, int | float):
            if float(d.get("completed_at") or 0.0) < at - SKEW:
                sim.violate(11, f"{p.eid}/{d['id']}: timed out at {d.get('completed_at')}, before its deadline {at}")
    sim.count(f"deadlined_{ex.get('status')}")
    start_at, first = ex.get("start_at"), docs.get("s:000001")
    taken = None if first is None else float(first.get("created_at") or 0.0)
    if isinstance(start_at, int | float) and taken is not None and taken < start_at - SKEW:
        sim.violate(11, f"{p.eid}: its first step was taken at {taken}, before its start {start_at}")
