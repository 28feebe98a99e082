"""Which step's failure ended a workflow (a retry re-runs that step): the mark a step's error
carries and how it is found in an exception chain."""

from __future__ import annotations

__all__ = ["FAILED_STEP", "failed_step"]

#: attribute of a step's ActivityError/ChildWorkflowError: ``(its step, the steps taken when
#: it was raised)`` (see :meth:`WorkflowContext.outcome`)
FAILED_STEP = "durable_step"


def failed_step(exc: BaseException) -> tuple[int, int] | None:
    """``(step, taken)``: the step whose failure ended a workflow that raised ``exc`` and how many
    steps were taken when it was raised; None if the workflow's own code failed.

    The step's error itself escaped (re-raised, or the first failure of a gather), or ``exc`` was
    raised while handling it (``raise Other() from err``, a compensation giving up): Python's
    exception chain says which. A step failure caught and gone past is not in the chain."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        step = getattr(cur, FAILED_STEP, None)
        if isinstance(step, tuple) and len(step) == 2:
            return int(step[0]), int(step[1])
        cur = cur.__cause__ or cur.__context__
    return None
