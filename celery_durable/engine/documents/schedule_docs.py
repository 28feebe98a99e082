"""The documents of managed schedules (engine/schedules/) as a type, declared in :mod:`.records`' ``FIELDS``."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["ScheduleDoc"]


class ScheduleDoc(TypedDict, total=False):
    """``sch:all``/``s:<name digest>``: one schedule, due (``"schedule"``) at its next tick plus
    that tick's jitter (engine/schedules/firing.py); etag-guarded."""

    pk: str
    id: str
    type: str
    _etag: str
    due_kind: str | None
    due_at: float | None
    name: str
    workflow: str
    #: the encoded ``args``/``kwargs`` of every execution it starts
    payload: dict[str, Any]
    #: its ticks (engine/schedules/spec.py): ``every`` seconds or ``cron`` in ``tz``
    every: float | None
    cron: str | None
    tz: str
    start_at: float | None
    end_at: float | None
    overlap: str
    catchup_window: float
    jitter: float
    pause_on_failure: bool
    #: the next tick not decided yet (``None``: none left before ``end_at``)
    next_tick: float | None
    #: the executions it started that were running when last looked at
    running: list[str]
    #: a tick kept for when the running one ends (``buffer_one``, ``cancel_other``)
    buffered: float | None
    #: the execution id the kept tick starts with (a trigger's is to the microsecond, not a tick's)
    buffered_id: str | None
    #: starts decided and recorded but maybe not created yet: ``{"id", "tick"}`` (created, create-only, next)
    starting: list[dict[str, Any]]
    #: the last start: ``{"tick", "execution", "at"}``
    last: dict[str, Any] | None
    #: ``started``, ``skipped`` (overlap), ``missed`` (past the catch-up window), ``dropped`` (a buffered tick replaced)
    counts: dict[str, int]
    paused: bool
    paused_reason: str | None
    paused_by: str | None
    paused_at: float | None
    #: the latest operator actions and self-pauses: ``{"action", "by", "at", "reason"}``
    actions: list[dict[str, Any]]
    created_at: float
    updated_at: float
