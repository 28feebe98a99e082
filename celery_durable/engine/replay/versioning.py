"""Versioning: ``wf.patched`` and ``wf.deprecate_patch`` (Temporal's semantics; README "Versioning").

New workflow code must replay the histories that running executions recorded with the old code.
``patched(change_id)`` tells the two apart at the point of the change:

* the next step of the history is a *patch marker* of this change: the execution took the new
  branch before; it is consumed (a step) and the answer is True;
* the next step is anything else (the old code's step): the history was recorded before the
  patch existed; nothing is consumed, so its step numbers stay as they were, and the answer is
  False (take the old branch);
* there is no next step: the execution reaches this point on the new code; a marker is recorded
  (so later replays answer True) and the answer is True.

A change id keeps its first answer for the rest of the replay, as in Temporal (a loop asking
again gets the same branch). ``deprecate_patch(change_id)`` is for code that dropped the old
branch: it consumes the marker where a history has one and records nothing, so it can itself be
removed once no execution that took the marker is left.
"""

from __future__ import annotations

from celery_durable.engine.documents.model import marker_id
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.replay.context import WorkflowContext

__all__ = ["patched", "deprecate_patch"]

_PATCH = StepKind.PATCH.value


def _check(change_id: object) -> str:
    if not isinstance(change_id, str) or not change_id:
        raise ValueError(f"a patch's change id must be a non-empty string, not {change_id!r}")
    return change_id


def _marked(ctx: WorkflowContext, change_id: str) -> bool | None:
    """True when the next step of the history is this change's marker, False when it is another
    step, None at the end of the history."""
    nxt = ctx.doc(marker_id(ctx.seq + 1, ctx.run))
    if nxt is None:
        return None
    return (nxt.get("kind"), nxt.get("name")) == (_PATCH, change_id)


def patched(ctx: WorkflowContext, change_id: str) -> bool:
    """Whether this execution takes the new code path of ``change_id`` (see the module docstring)."""
    change_id = _check(change_id)
    ctx.refuse_in_query(f"wf.patched({change_id!r})")
    known = ctx.patches.get(change_id)
    if known is not None:
        return known
    marked = _marked(ctx, change_id)
    if marked is False:
        answer = False
    else:
        seq, marker = ctx._step(_PATCH, change_id)
        if marker is None:
            ctx._marker(seq, _PATCH, change_id, value=True)
        answer = True
    ctx.patches[change_id] = answer
    return answer


def deprecate_patch(ctx: WorkflowContext, change_id: str) -> None:
    """Accept histories that took ``change_id``'s marker here; record nothing for new ones."""
    change_id = _check(change_id)
    ctx.refuse_in_query(f"wf.deprecate_patch({change_id!r})")
    if change_id not in ctx.patches and _marked(ctx, change_id):
        ctx._step(_PATCH, change_id)
    ctx.patches.setdefault(change_id, True)
