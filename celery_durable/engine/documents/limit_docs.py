"""The documents of keyed limits (engine/limits/) as types, declared in :mod:`.records`' ``FIELDS``."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["StepLimitInfo", "LimitDoc"]


class StepLimitInfo(TypedDict, total=False):
    """What a limited step waits on (engine/limits/spec.py ``step_limit``), on its marker."""

    name: str
    key: str
    max: int | None
    rate: list[float] | None
    #: priority (lower first) and fairness group
    p: int
    g: str
    #: when the step was scheduled (the latest scheduled declaration wins)
    d: float


class LimitDoc(TypedDict, total=False):
    """``lim:<name>:<key digest>/slots``: one limit's slots and queue for one key (engine/limits/table.py)."""

    pk: str
    id: str
    type: str
    _etag: str
    #: due (``"limit"``) only while steps wait: a holder's expiry or the rate window's next opening
    due_kind: str | None
    due_at: float | None
    name: str
    key: str
    max: int | None
    rate: list[float] | None
    holders: dict[str, Any]
    #: queued steps (engine/limits/table.py ``step_waiter``); one queued at dispatch may carry its
    #: message (``m``, engine/limits/grants.py) to be handed a slot without a read
    waiters: list[dict[str, Any]]
    #: ``[time, step]`` of the starts within the rate's period
    starts: list[Any]
    #: when the declaration in force (``max``, ``rate``) was scheduled
    declared_at: float
    #: when each group holding or waiting was last granted a slot (its turn: engine/limits/table.py)
    served: dict[str, float]
