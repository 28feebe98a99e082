"""What the engine's operations answer, spelled once: str-Enums that compare equal to their strings.

A replay decides a :class:`ReplayKind`; a drive answers a :class:`DriveOutcome` (the replay's kind
when it committed, or why it did not); a clock asked to fire answers a :class:`ClockOutcome`; an
effect's claim a :class:`ClaimOutcome`. The glue branches on them (retry a delivery that came too
early, or before its document was visible), so they are compared across layers: keep the values.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ClaimOutcome", "ClockOutcome", "DriveOutcome", "ReplayKind"]


class ReplayKind(StrEnum):
    """How a replay of the workflow function ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"  # its deadline's cancel ended it (engine/starts/deadlines.py)
    SUSPENDED = "suspended"  # waiting on steps
    CONTINUED = "continued"  # continue-as-new
    UNKNOWN = "unknown"  # the workflow is not registered in this process


class DriveOutcome(StrEnum):
    """What a drive did: the kind of the replay it committed, or why it committed none."""

    COMPLETED = "completed"
    FAILED = "failed"  # committed a failure, or failed the execution on a corrupt document
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    SUSPENDED = "suspended"
    CONTINUED = "continued"
    UNKNOWN = "unknown"
    MISSING = "missing"  # no such execution (yet: a lagging read may not see it)
    TERMINAL = "terminal"  # already ended: a late outcome is recorded, nothing driven
    LEASE_LOST = "lease-lost"  # another process took the exec lease this drive held
    DECLINED = "declined"  # an eager drive left it to a worker (nothing written)
    DEFERRED = "deferred"  # another process drives it: ours is recorded for its next round
    NOOP = "noop"  # the replay decided nothing new
    CONTENDED = "contended"  # gave up after MAX_ROUNDS of lost races


class ClockOutcome(StrEnum):
    """What asking a timer to fire did."""

    FIRED = "fired"
    DONE = "done"  # already fired, or no longer wanted
    EARLY = "early"  # not due yet (a delivery ahead of its time: clock skew)
    MISSING = "missing"  # no such timer step (yet)


class ClaimOutcome(StrEnum):
    """What an effect row's claim found."""

    CLAIMED = "claimed"
    BLOCKED = "blocked"  # an earlier row of its key runs
    EARLY = "early"  # a retry's backoff has not elapsed
    DUPLICATE = "duplicate"  # another delivery holds it
    SETTLED = "settled"
    MISSING = "missing"
    CONTENDED = "contended"  # rounds used up: tried again later
