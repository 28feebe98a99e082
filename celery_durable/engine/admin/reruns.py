"""Re-runs: the ids a step takes after an operator's reset, resume or retry (issue 23, item 2).

An operation re-runs part of an execution: the steps it forgot are taken again under the same
numbers. Ids derived from (execution, run, step) alone would then name what the old run already
sent, and the new send would be taken for a repeat of the old one (an ``emit`` dropped, a child
joined, a signal deduplicated). So every operation bumps the exec's ``reruns`` and default ids
of steps taken afterwards carry ``~<n>`` (``schema.rerun_suffix``). An id is recorded in its
step's marker when the step is first taken: a replay of a kept step finds it there, never anew.

The same holds for an id purged and started again (a new *life* of the id): its steps number
from 1 again, and the effects, children and signals of the purged life outlive it (an outbox
row until its retention, a child purged on its own schedule, a receiver's ``sgk:`` record). So a
purge's record keeps the rerun count of what it purged, and a new life counts on from the
highest one recorded (:func:`reborn`): its ids are new from its first step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_durable.engine.documents.records import ExecDoc, as_exec
from celery_durable.stores.base import Doc

__all__ = ["RERUNS", "rerun_count", "bump_reruns", "reborn", "emit_state", "children_of"]

#: the exec field counting operator operations that re-ran the execution
RERUNS = "reruns"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def rerun_count(ex: Mapping[str, Any]) -> int:
    """How many operations re-ran ``ex``; never below the older ``resets`` (counted by resets
    only), so the ids executions took before ``reruns`` existed stay theirs."""
    return max(_int(ex.get(RERUNS)), _int(ex.get("resets")))


#: the id of the first purge's record in a partition (engine/admin/purge.py RECORD_TYPE, also its
#: type); later purges of the id record ``purged:<n>``
_PURGED = "purged"


def reborn(ex: Mapping[str, Any], docs: Mapping[str, Doc]) -> ExecDoc:
    """``ex`` as the driver replays it: an execution created under a purged id (its partition
    ``docs`` hold purge records) counts its reruns on past every count a purged life of the id
    recorded, so none of its ids is one an earlier life took. Written with its first commit."""
    if _PURGED not in docs:  # the common case, without a scan of the history
        return as_exec(ex)
    base = max((_int(d.get(RERUNS)) + 1 for d in docs.values() if d.get("type") == _PURGED), default=0)
    return as_exec(ex if base <= rerun_count(ex) else {**ex, RERUNS: base})


def bump_reruns(ex: ExecDoc) -> dict[str, int]:
    """The exec field an operation writes with the batch that reopens the execution."""
    return {RERUNS: rerun_count(ex) + 1}


def emit_state(marker: Mapping[str, Any]) -> str:
    """What became of an ``emit`` step's effect: ``enqueued``, ``not enqueued (<reason>)``
    (``duplicate``/``conflict``: an explicit id taken before; ``cancelled``), or ``recorded``
    (its intent is not admitted yet)."""
    admitted = marker.get("admitted")
    if admitted is True:
        return "enqueued"
    if admitted is False:
        reason = marker.get("reason") or ("cancelled" if marker.get("cancelled") else "conflict")
        return f"not enqueued ({reason})"
    return "recorded"


def children_of(steps: list[Doc]) -> list[str]:
    """The child executions started by the step markers among ``steps`` (documents an operation
    forgets): finished ones are forgotten with them, so the re-run's steps start their own."""
    return [
        str(d["child_id"])
        for d in steps
        if d.get("type") == "step" and d.get("kind") == "child" and isinstance(d.get("child_id"), str)
    ]
