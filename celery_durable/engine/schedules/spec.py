"""What a schedule is: its ticks (an interval aligned to the epoch, or a cron expression read in an
IANA time zone), its overlap policy, catch-up window and jitter — checked in the caller, stored as
JSON (strings and numbers only).

Cron fields are ``minute hour day-of-month month day-of-week`` (Celery's ``crontab`` order is
``minute hour day_of_week day_of_month month_of_year``; ``celery_durable.schedules`` converts
one). As in Celery's ``crontab``, a day must match *both* the day of month and the day of week.
Day of week: 0 or 7 is Sunday, names (``mon``) and ranges (``mon-fri``) are read. A local time a
daylight-saving change skips (02:30 on the spring-forward night in Europe/Paris) fires at the
first instant after the gap (03:00); a local time that happens twice (the autumn night) fires
once, at its first occurrence.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_durable.engine.starts.deadlines import check_seconds
from celery_durable.errors import ConfigurationError

__all__ = [
    "OVERLAPS",
    "SKIP",
    "BUFFER_ONE",
    "ALLOW_ALL",
    "CANCEL_OTHER",
    "Spec",
    "parse_cron",
    "check_zone",
    "jitter_of",
    "tick_delay",
    "tick_stamp",
]

SKIP, BUFFER_ONE, ALLOW_ALL, CANCEL_OTHER = "skip", "buffer_one", "allow_all", "cancel_other"
OVERLAPS = (SKIP, BUFFER_ONE, ALLOW_ALL, CANCEL_OTHER)

_NAMES = {
    3: {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    4: {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())},
}
#: (lowest, highest) of each cron field: minute, hour, day of month, month, day of week
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_PART = re.compile(r"\A(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?\Z")
#: how far ahead a cron expression is searched for its next tick (Feb 29 on a Monday: 28 years)
_HORIZON_DAYS = 366 * 30
_DAY = 86_400


def _value(text: str, field: int) -> int:
    if text.isdigit():
        return int(text)
    named = _NAMES.get(field, {}).get(text[:3]) if len(text) >= 3 else None
    if named is None or text not in (text[:3], _full_name(text)):
        raise ConfigurationError(f"cron {_FIELD_NAMES[field]}: {text!r} is not a number or a name")
    return named


def _full_name(text: str) -> str:
    full = {"mon": "monday", "tue": "tuesday", "wed": "wednesday", "thu": "thursday", "fri": "friday"}
    full |= {"sat": "saturday", "sun": "sunday"}
    return full.get(text[:3], text[:3])


def _field(text: str, field: int) -> frozenset[int]:
    low, high = _RANGES[field]
    values: set[int] = set()
    for part in text.lower().split(","):
        match = _PART.match(part.strip())
        if match is None:
            raise ConfigurationError(f"cron {_FIELD_NAMES[field]}: cannot read {part!r}")
        span, step_text = match.groups()
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ConfigurationError(f"cron {_FIELD_NAMES[field]}: a step must be >= 1, not {step}")
        if span == "*":
            first, last = low, high if field != 4 else 6
        elif "-" in span:
            a, b = span.split("-")
            first, last = _value(a, field), _value(b, field)
        else:
            first = last = _value(span, field)
            if step_text:  # "5/15": from 5 to the end, every 15 (as Celery's crontab reads it)
                last = high if field != 4 else 6
        if not (low <= first <= high and low <= last <= high) or first > last:
            raise ConfigurationError(f"cron {_FIELD_NAMES[field]}: {part!r} is outside {low}-{high}")
        values.update(range(first, last + 1, step))
    if field == 4 and 7 in values:  # Sunday is 0 and 7
        values = (values - {7}) | {0}
    return frozenset(values)


def parse_cron(expr: str) -> tuple[frozenset[int], ...]:
    """The five fields of ``expr`` as sets (minute, hour, day of month, month, day of week: 0 is
    Sunday); a bad expression raises :class:`ConfigurationError` saying which field."""
    if not isinstance(expr, str):
        raise ConfigurationError(f"cron must be a string like '0 9 * * mon-fri', not {expr!r}")
    parts = expr.split()
    if len(parts) != 5:
        raise ConfigurationError(f"cron needs 5 fields (minute hour day-of-month month day-of-week), got {expr!r}")
    return tuple(_field(p, i) for i, p in enumerate(parts))


#: the most days of each month (February: 29, in a leap year)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _check_matches(expr: str, fields: tuple[frozenset[int], ...]) -> None:
    """Refuse an expression naming no date (30 February): stored, it would never fire. Any day of
    a month falls on each day of the week within 28 years, inside the search horizon."""
    _, _, days, months, _ = fields
    if not any(day <= _MONTH_DAYS[month - 1] for month in months for day in days):
        raise ConfigurationError(f"cron {expr!r} never matches: no month it names has the days it names")


def check_zone(tz: object) -> ZoneInfo:
    """The IANA zone named ``tz`` (``"Europe/Paris"``); an unknown one raises ConfigurationError."""
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"tz must be an IANA time zone name like 'Europe/Paris', not {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"unknown time zone {tz!r}") from exc


def jitter_of(name: str, tick: float, jitter: float) -> float:
    """A delay in ``[0, jitter)`` for one tick, the same in every process (a hash of the schedule's
    name and the tick), so two beats agree on when a jittered tick is due."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{name}\x00{tick!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * jitter


def tick_delay(spec: Spec, name: str, tick: float, jitter: float) -> float:
    """The jitter of one tick, at most the time to the next tick (as Temporal caps it): a longer
    delay made a tick wait behind the last one's, so ticks fired in bursts and counted missed."""
    if jitter <= 0:
        return 0.0
    nxt = spec.next_tick(tick)
    return jitter_of(name, tick, jitter if nxt is None else min(jitter, nxt - tick))


def tick_stamp(tick: float) -> str:
    """A tick as the tail of its execution id (UTC, to the second, as ``Durable.schedule``'s ids)."""
    return datetime.fromtimestamp(tick, tz=UTC).strftime("%Y%m%dT%H%M%S")


@dataclass(frozen=True)
class Spec:
    """When a schedule ticks: ``every`` seconds (aligned to the epoch) or ``cron`` in ``tz``,
    between ``start_at`` and ``end_at`` (epoch seconds, optional)."""

    every: float | None = None
    cron: str | None = None
    tz: str = "UTC"
    start_at: float | None = None
    end_at: float | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Spec:
        """Read back the stored fields (``every``, ``cron``, ``tz``, ``start_at``, ``end_at``)."""
        return cls(fields.get("every"), fields.get("cron"), fields.get("tz") or "UTC",
                   fields.get("start_at"), fields.get("end_at"))  # fmt: skip

    def check(self) -> Spec:
        """Raise ConfigurationError unless exactly one of ``every`` and ``cron`` is valid, ``tz``
        is a known zone, and ``start_at`` comes before ``end_at``."""
        if (self.every is None) == (self.cron is None):
            raise ConfigurationError("a schedule needs one of every= (a timedelta) and cron= (an expression)")
        if self.every is not None:
            every = check_seconds("every", self.every, zero_ok=False) or 0.0
            if every < 1:  # a tick's execution id is to the second: two ticks a second would share one
                raise ConfigurationError(f"every must be at least 1 second, not {every:g}")
        else:
            assert self.cron is not None
            _check_matches(self.cron, parse_cron(self.cron))
        check_zone(self.tz)
        for name in ("start_at", "end_at"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
                raise ConfigurationError(f"{name} must be a datetime or epoch seconds, not {value!r}")
        if self.start_at is not None and self.end_at is not None and self.end_at <= self.start_at:
            raise ConfigurationError("end_at must come after start_at")
        return self

    def fields(self) -> dict[str, Any]:
        return {"every": self.every, "cron": self.cron, "tz": self.tz, "start_at": self.start_at, "end_at": self.end_at}

    def describe(self) -> str:
        if self.every is not None:
            return f"every {timedelta(seconds=self.every)}"
        return f"cron {self.cron} ({self.tz})"

    def next_tick(self, after: float) -> float | None:
        """The first tick strictly after ``after`` (and not before ``start_at``); ``None`` past
        ``end_at`` or when the expression never matches again."""
        if self.start_at is not None and after < self.start_at:
            after = math.nextafter(self.start_at, -math.inf)
        if self.every is not None:
            tick = (math.floor(after / self.every) + 1) * self.every
        else:
            found = self._next_cron(after)
            if found is None:
                return None
            tick = found
        return None if self.end_at is not None and tick >= self.end_at else tick

    def ticks(self, start: float, end: float, most: int) -> list[float]:
        """The ticks in ``[start, end)``; ConfigurationError when there are more than ``most``."""
        found: list[float] = []
        tick = self.next_tick(start - 1e-6)  # ticks from start on, start included
        while tick is not None and tick < end:
            if len(found) == most:
                raise ConfigurationError(f"more than {most} ticks between those times: give a shorter range")
            found.append(tick)
            tick = self.next_tick(tick)
        return found

    def _next_cron(self, after: float) -> float | None:
        assert self.cron is not None
        minutes, hours, days, months, weekdays = parse_cron(self.cron)
        zone = ZoneInfo(self.tz)
        local = datetime.fromtimestamp(after, tz=UTC).astimezone(zone).replace(tzinfo=None)
        day = local.replace(hour=0, minute=0, second=0, microsecond=0)
        # the local times of after's day before it are skipped unread (each is a zone conversion:
        # a minute cron read 1440 a call); near a DST change a local time may map later, so a
        # margin of hours is read then
        offsets = {datetime.fromtimestamp(after + d, tz=zone).utcoffset() for d in (-2 * _DAY, 0, 2 * _DAY)}
        floor = local if len(offsets) == 1 else local - timedelta(hours=3)
        for _ in range(_HORIZON_DAYS):
            # isoweekday: Monday 1 .. Sunday 7; cron: Sunday 0
            if day.month in months and day.day in days and day.isoweekday() % 7 in weekdays:
                for hour in sorted(hours):
                    if day.replace(hour=hour, minute=59, second=59) < floor:
                        continue
                    for minute in sorted(minutes):
                        if (naive := day.replace(hour=hour, minute=minute)) < floor:
                            continue
                        at = _instant(naive, zone)
                        if at > after:
                            return at
            day += timedelta(days=1)
        return None


def _instant(naive: datetime, zone: ZoneInfo) -> float:
    """The epoch seconds of local time ``naive`` in ``zone``: the first occurrence of an ambiguous
    time; for a time that does not exist (skipped by a DST change), the first instant after it."""
    first = naive.replace(tzinfo=zone, fold=0)
    at = first.timestamp()
    if datetime.fromtimestamp(at, tz=zone).replace(tzinfo=None) == naive:
        return at
    # in a gap: fold=1 reads it with the offset after the change, fold=0 with the one before;
    # the change happened between those two instants, at a whole minute
    low = naive.replace(tzinfo=zone, fold=1).timestamp()
    t = math.floor(min(low, at) / 60) * 60
    offset = datetime.fromtimestamp(t, tz=zone).utcoffset()
    while t < max(low, at) and datetime.fromtimestamp(t, tz=zone).utcoffset() == offset:
        t += 60
    return float(t)
