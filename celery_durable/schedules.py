"""``durable.schedules``: schedules as managed objects in the store (issue 27 §1).

>>> durable.schedules.create("nightly-report", report, "eu", cron="0 9 * * mon-fri", tz="Europe/Paris")
>>> durable.schedules.pause("nightly-report", reason="quarter close")
>>> durable.schedules.trigger("nightly-report")

A managed schedule is a document in the durable store, fired by beat's clock scan
(engine/schedules/): no ``beat_schedule`` entry, no database scheduler. Each tick starts the
execution ``<name>@<tick, UTC>`` create-only, so two beats start one execution per tick. The
schedules of ``Durable.schedule(...)`` (declared in code, ticked by beat) are listed too, as
``kind="code"``, and are read-only here. Everything a caller gives is checked here, before
anything is stored (:class:`ConfigurationError`, or the payload codec's error).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.pending_ops import check_field
from celery_durable.engine.documents.checks import check_workflow_id
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.limits.spec import limit_of_start
from celery_durable.engine.schedules import manage
from celery_durable.engine.schedules.firing import SCHEDULES_PK, manual_execution_id, schedule_id, tick_execution_id
from celery_durable.engine.schedules.manage import ScheduleInfo
from celery_durable.engine.schedules.spec import OVERLAPS, SKIP, Spec, check_zone
from celery_durable.engine.starts.deadlines import check_seconds
from celery_durable.errors import ConfigurationError

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine
    from celery_durable.engine.registry import Registry, WorkflowDef

__all__ = ["Schedules", "ScheduleInfo", "OVERLAPS", "DEFAULT_CATCHUP", "cron_of"]

log = logging.getLogger("celery_durable.schedules")

#: how late a tick may still fire (beat down, a slow scan) when none is given
DEFAULT_CATCHUP = timedelta(minutes=5)
#: the shortest catch-up window taken (as Temporal's): a shorter one would miss ticks a scan fires late
MIN_CATCHUP = 10.0


def cron_of(value: object) -> str:
    """A cron expression (``minute hour day-of-month month day-of-week``) from a string or a
    Celery ``crontab`` (whose fields it reads as given)."""
    if isinstance(value, str):
        return value
    fields = ("_orig_minute", "_orig_hour", "_orig_day_of_month", "_orig_month_of_year", "_orig_day_of_week")
    if all(hasattr(value, f) for f in fields):
        parts = [str(getattr(value, f)).replace(" ", "") for f in fields]
        return " ".join(parts)
    raise ConfigurationError(f"cron must be a string like '0 9 * * mon-fri' or a celery crontab, not {value!r}")


#: the times a schedule takes (epoch seconds): its ticks' ids and a cron search ahead stay dates
_EARLIEST, _LATEST = datetime(1900, 1, 1, tzinfo=UTC).timestamp(), datetime(9000, 1, 1, tzinfo=UTC).timestamp()


def _epoch(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigurationError(f"{name} must be a timezone-aware datetime (or epoch seconds)")
        at = value.timestamp()
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        at = float(value)
    else:
        raise ConfigurationError(f"{name} must be a datetime or epoch seconds, not {value!r}")
    if not _EARLIEST <= at <= _LATEST:  # a tick there has no date: its id, a listing, a cron search fail
        raise ConfigurationError(f"{name} must be a time between the years 1900 and 9000, not {value!r}")
    return at


def _who(by: object) -> str:
    """Who acts (``None``: this process's user@host), checked as an execution's operator actions
    check it: a string within its length, refused (never truncated)."""
    if by is None:
        return actor()
    check_field(ConfigurationError, "by", by)
    return str(by)


def _why(reason: object) -> str | None:
    check_field(ConfigurationError, "reason", reason)
    return None if reason is None else str(reason)


class Schedules:
    """The managed schedules of one engine, and the code-declared ones of its app (listed)."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        registry: Registry,
        code: Callable[[], Mapping[str, dict[str, Any]]] = dict,
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._code = code

    # --- checks ----------------------------------------------------------------------------

    def _definition(self, workflow: object) -> WorkflowDef:
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        definition = self._registry.workflow(name) if isinstance(name, str) else None
        if definition is None:
            raise ConfigurationError(f"unknown workflow {workflow!r}: register it with @durable.workflow first")
        return definition

    def _code_entries(self) -> dict[str, dict[str, Any]]:
        return {str(e["args"][0]): e for e in self._code().values()}

    def _timing(self, given: dict[str, Any]) -> dict[str, Any]:
        """The stored timing and policy fields of ``given`` (keywords of create/update), checked."""
        out: dict[str, Any] = {}
        if "every" in given and given["every"] is not None:
            out["every"] = check_seconds("every", given["every"], zero_ok=False)
        if "cron" in given and given["cron"] is not None:
            out["cron"] = cron_of(given["cron"])
        if "tz" in given:
            check_zone(given["tz"])
            out["tz"] = given["tz"]
        for key in ("start_at", "end_at"):
            if key in given:
                out[key] = _epoch(key, given[key])
        if "overlap" in given:
            if given["overlap"] not in OVERLAPS:
                raise ConfigurationError(f"overlap must be one of {', '.join(OVERLAPS)}, not {given['overlap']!r}")
            out["overlap"] = given["overlap"]
        if "jitter" in given:
            out["jitter"] = check_seconds("jitter", given["jitter"], zero_ok=True) or 0.0
        if "catchup_window" in given:
            window = check_seconds("catchup_window", given["catchup_window"], zero_ok=False) or 0.0
            if window < MIN_CATCHUP:  # a tick fired a scan interval late would be missed
                raise ConfigurationError(f"catchup_window must be at least {MIN_CATCHUP:g} seconds, not {window:g}")
            out["catchup_window"] = window
        if "pause_on_failure" in given:
            if not isinstance(given["pause_on_failure"], bool):
                raise ConfigurationError("pause_on_failure must be True or False")
            out["pause_on_failure"] = given["pause_on_failure"]
        return out

    def _managed(self, name: str, creating: bool = False) -> str:
        # a managed schedule stays reachable when a later deploy declares its name in code too
        # (both tick into the same ids, one execution a tick): the operator can still delete it
        if name in self._code_entries() and (creating or manage.get(self._engine(), name) is None):
            raise ConfigurationError(f"schedule {name!r} is declared in code (Durable.schedule): change it there")
        return name

    # --- actions ---------------------------------------------------------------------------

    def create(
        self,
        name: str,
        workflow: Any,
        *args: Any,
        every: timedelta | float | None = None,
        cron: Any = None,
        tz: str = "UTC",
        overlap: str = SKIP,
        catchup_window: timedelta | float = DEFAULT_CATCHUP,
        jitter: timedelta | float = 0.0,
        pause_on_failure: bool = False,
        start_at: datetime | float | None = None,
        end_at: datetime | float | None = None,
        by: str | None = None,
        **kwargs: Any,
    ) -> ScheduleInfo:
        """Store a schedule starting ``workflow(*args, **kwargs)`` at each tick: ``every`` (a
        ``timedelta``, ticks aligned to the epoch) or ``cron`` (``"0 9 * * mon-fri"`` or a Celery
        ``crontab``) read in ``tz``; ``overlap`` (skip, buffer_one, allow_all, cancel_other) when
        the last one still runs; ticks later than ``catchup_window`` are not run; ``jitter``
        delays each tick by a fixed amount below it; ``pause_on_failure`` pauses it when one of its
        executions fails. Checked here; a name in use raises ConfigurationError. The keywords
        above are the schedule's: a workflow argument of one of those names is given by position."""
        check_workflow_id(name, "schedule name")
        # its executions' ids are <name>@<time>: a trigger's, the longest, must be a valid id too
        check_workflow_id(manual_execution_id(name, 0.0), "schedule name (with its ticks' @<time>)")
        self._managed(name, creating=True)
        definition = self._definition(workflow)
        payload = definition.codec.encode_args(args, kwargs)
        fields = self._timing(
            dict(every=every, cron=cron, tz=tz, overlap=overlap, catchup_window=catchup_window, jitter=jitter)
            | dict(pause_on_failure=pause_on_failure, start_at=start_at, end_at=end_at)
        )
        fields = {"every": None, "cron": None} | fields
        Spec.of(fields).check()
        # its limit's key function, on this input: fails here, not at every tick
        limit_of_start(definition.limit, lambda: (args, kwargs), 0.0)
        fields.update(workflow=definition.name, payload=payload)
        return manage.create(self._engine(), name, fields, _who(by))

    def update(self, name: str, *, by: str | None = None, **changes: Any) -> ScheduleInfo:
        """Change a managed schedule: any keyword of :meth:`create`, ``workflow``, and ``args``/
        ``kwargs`` (a tuple and a dict; the one not given stays as stored) for its input. A new
        timing counts from now. Checked here."""
        self._managed(name)
        current = manage.get(self._engine(), name)
        if current is None:
            raise ConfigurationError(f"no schedule named {name!r}")
        unknown = set(changes) - manage.CHANGEABLE - {"args", "kwargs"}
        if unknown:
            raise ConfigurationError(f"update() cannot change {sorted(unknown)}")
        if "payload" in changes:  # the stored, encoded input: given as args/kwargs, checked by the codec
            raise ConfigurationError("update() takes the input as args= and kwargs=, not payload=")
        doc = self._engine().store.read(SCHEDULES_PK, schedule_id(name)) or {}
        fields = self._timing(changes)
        if "every" in changes or "cron" in changes:  # one replaces the other
            fields = {"every": None, "cron": None} | fields
        Spec.of({**doc, **fields}).check()
        if {"workflow", "args", "kwargs"} & set(changes):  # the input not given stays as stored
            definition = self._definition(changes.get("workflow", doc.get("workflow")))
            stored = doc.get("payload") or {}
            args = tuple(changes["args"]) if "args" in changes else tuple(stored.get("args") or ())
            kwargs = dict(changes["kwargs"]) if "kwargs" in changes else dict(stored.get("kwargs") or {})
            limit_of_start(definition.limit, lambda: (args, kwargs), 0.0)  # its key function, here
            fields.update(workflow=definition.name, payload=definition.codec.encode_args(args, kwargs))
        return manage.update(self._engine(), name, fields, _who(by))

    def delete(self, name: str) -> bool:
        """Delete a managed schedule (its executions go on); False if there was none."""
        return manage.delete(self._engine(), self._managed(name))

    def pause(self, name: str, *, reason: str | None = None, by: str | None = None) -> bool:
        """Pause: no tick fires until :meth:`resume`. False if it was paused already. Recorded."""
        return manage.pause(self._engine(), self._managed(name), _who(by), _why(reason))

    def resume(self, name: str, *, reason: str | None = None, by: str | None = None) -> bool:
        """Resume from the next tick after now; False if it was not paused. Recorded."""
        return manage.resume(self._engine(), self._managed(name), _who(by), _why(reason))

    def trigger(self, name: str, *, by: str | None = None) -> str | None:
        """Start one execution now, by the overlap policy (paused or not); its id, or None when
        the policy skipped or kept it."""
        return manage.trigger(self._engine(), self._managed(name), _who(by))

    def backfill(
        self,
        name: str,
        start: datetime | float,
        end: datetime | float,
        *,
        overlap: str | None = None,
        by: str | None = None,
    ) -> list[str]:
        """Run the ticks in ``[start, end)`` now, oldest first, by ``overlap`` (default the
        schedule's: ``allow_all`` starts every one). A tick that ran already is not started
        again. At most 1000 ticks a call. Returns the execution ids it started."""
        if overlap is not None and overlap not in OVERLAPS:
            raise ConfigurationError(f"overlap must be one of {', '.join(OVERLAPS)}, not {overlap!r}")
        first, last = _epoch("start", start), _epoch("end", end)
        assert first is not None and last is not None
        return manage.backfill(self._engine(), self._managed(name), first, last, _who(by), overlap)

    def get(self, name: str) -> ScheduleInfo | None:
        """One schedule (managed, or else declared in code), or None."""
        managed = manage.get(self._engine(), name)
        code = self._code_entries().get(name)
        return self._code_info(name, code) if managed is None and code is not None else managed

    def list(self) -> list[ScheduleInfo]:
        """Every schedule: the managed ones and those declared in code (``kind="code"``), by name."""
        managed = manage.listing(self._engine())
        code = self._code_entries()
        for both in sorted({i.name for i in managed} & set(code)):
            log.warning("schedule %r is managed and declared in code: they tick into the same ids", both)
        found = managed + [self._code_info(n, e) for n, e in code.items()]
        return sorted(found, key=lambda i: i.name)

    def _code_info(self, name: str, entry: dict[str, Any]) -> ScheduleInfo:
        every = entry["schedule"]
        if isinstance(every, timedelta):
            spec, period = f"every {every}", every.total_seconds()
        else:
            spec, period = f"crontab {cron_of(every)}", None
        eng = self._engine()
        last_id = status = None
        if period:  # the current tick's execution, if beat started it
            tick = math.floor(eng.clock.now() / period) * period
            ex = eng.store.read(tick_execution_id(name, tick), EXEC_ID)
            if ex is not None:
                last_id, status = tick_execution_id(name, tick), str(ex.get("status"))
        nxt = None if not period else (math.floor(eng.clock.now() / period) + 1) * period
        return ScheduleInfo(
            name=name,
            workflow=str(entry["args"][1]),
            kind="code",
            spec=spec,
            next_fire=nxt,
            last_execution=last_id,
            last_status=status,
            catchup_window=None,
        )


def as_utc(epoch: float | None) -> str:
    """A time of a listing, for people (UTC)."""
    return "-" if epoch is None else datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
