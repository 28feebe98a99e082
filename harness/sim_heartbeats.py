"""Heartbeats in the simulation (issue 26 §2, §3): running attempts send their progress as
heartbeat details, the scheduled lease renewal writes them and may tell an attempt to stop.

Invariant 12 (sim_store.py): a step's recorded details never go back (``_written``), and an
attempt is told to stop only for one of its reasons (:func:`check_stops`, right after the renewal
that decided it, on the store as it is then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_durable.engine.activities.context import ActivityCancelled
from celery_durable.engine.documents.model import EXEC_ID, TERMINAL, marker_id, result_id

if TYPE_CHECKING:
    from harness.sim import Sim
    from harness.sim_store import Actor, InFlight

__all__ = ["beat", "check_stops", "stopped"]


def beat(sim: Sim, w: Actor) -> set[int]:
    """``activity.heartbeat(progress)`` from each attempt ``w`` runs, its progress going on from
    where the step's earlier attempts recorded theirs; the attempts already told to stop."""
    for fl in sim.inflight:
        if fl.actor is w and fl.ctx is not None:
            fl.progress = max(fl.progress, int(fl.attempt.heartbeat_details or 0)) + 1
            try:
                fl.ctx.heartbeat(fl.progress)
            except ActivityCancelled:
                pass  # it stops at its end (stopped)
    return {id(f) for f in sim.inflight if f.ctx is not None and f.ctx.cancel_reason is not None}


def check_stops(sim: Sim, w: Actor, told: set[int]) -> None:
    """Invariant 12 for the attempts of ``w`` the renewal just told to stop."""
    for fl in sim.inflight:
        if fl.actor is w and fl.ctx is not None and fl.ctx.cancel_reason is not None and id(fl) not in told:
            _check_stop(sim, fl)


def _check_stop(sim: Sim, fl: InFlight) -> None:
    req, attempt = fl.request, fl.attempt
    marker, outcome, ex = sim.inner.read_many(
        req.execution_id, [marker_id(req.seq, req.run), result_id(req.seq, req.run), EXEC_ID]
    )
    if outcome is not None or ex is None or marker is None or ex.get("status") in TERMINAL or ex.get("operations"):
        return  # (an operator's rewrite, sim_ops.py, may have reopened what the renewal read)
    if int(ex.get("run") or 0) > attempt.run or (marker.get("lease") or {}).get("holder") != attempt.holder:
        return
    lease = marker.get("lease") or {}
    if marker.get("limit") and float(lease.get("expires") or 0.0) <= sim.now + 1.0:
        return  # its lease lapsed while it held a limit slot (engine/activities/leases.py): it stops
    before = ex.get("cancel_before")
    awaited = any(isinstance(w, dict) and w.get("seq") == req.seq for w in ex.get("waiting") or [])
    if ex.get("cancel_requested") and isinstance(before, int) and req.seq <= before and awaited:
        return
    reason = fl.ctx.cancel_reason if fl.ctx is not None else None
    sim.violate(12, f"{req.execution_id} step {req.seq} was told to stop ({reason})")


def stopped(sim: Sim, fl: InFlight) -> bool:
    """An attempt a renewal told to stop ends as ``ActivityCancelled`` does: nothing recorded."""
    if fl.ctx is None or fl.ctx.cancel_reason is None:
        return False
    sim.count("activity_cancelled")
    fl.actor.engine.activities.interrupted(fl.attempt, fl.ctx, ActivityCancelled(fl.ctx.cancel_reason))
    return True
