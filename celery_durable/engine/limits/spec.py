"""What a limit is (:class:`Limit`) and what a step records of it when it is scheduled.

A step of a limited activity records ``limit`` on its marker in the scheduling commit: the
limit's name, the key its arguments give, the slot count and rate, its priority and its fairness
group. The worker that begins it reads that record, never the user's code: the key is computed
once, in the workflow, on the arguments as called, so a redelivery or a recovery re-send waits
in the same place.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from celery_durable.errors import ConfigurationError

__all__ = [
    "LIMIT_DOC_ID",
    "LIMIT_RECORD",
    "Limit",
    "StepLimit",
    "parse_rate",
    "step_limit",
    "WorkflowQueueing",
    "workflow_limit",
    "limit_of_start",
    "limit_of_stored",
    "limit_pk",
    "limit_fields",
    "declare_limit",
    "MAX_PRIORITY",
    "MAX_KEY_CHARS",
    "MAX_RATE_COUNT",
]

MAX_KEY_CHARS = 200
#: the id of a limit document in its partition (``limit_pk``)
LIMIT_DOC_ID = "slots"
#: ``ActivityRequest.options`` key of a new limited step's record (for its admission at dispatch)
LIMIT_RECORD = "limit_record"
#: a rate keeps one start time per start in its period: at most this many
MAX_RATE_COUNT = 1000
_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
#: a priority is a JSON number every store keeps exactly (an integer a double holds)
MAX_PRIORITY = 2**53


def parse_rate(rate: str | None) -> tuple[int, float] | None:
    """``"100/m"`` -> ``(100, 60.0)``; Celery's spelling (``/s``, ``/m``, ``/h``) and ``/d``."""
    if rate is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*([smhd])\s*", str(rate))
    if m is None:
        raise ConfigurationError(f"rate must look like '100/m' (per s, m, h or d), not {rate!r}")
    count, mult, unit = int(m.group(1)), m.group(2), m.group(3)
    per = _PERIODS[unit] * (float(mult) if mult else 1.0)
    if count < 1 or per <= 0:
        raise ConfigurationError(f"rate {rate!r} allows nothing")
    if count > MAX_RATE_COUNT:
        raise ConfigurationError(
            f"rate {rate!r}: at most {MAX_RATE_COUNT} starts per period are tracked; use a shorter period"
        )
    return count, per


@dataclass(frozen=True)
class Limit:
    """A limit shared by every worker: at most ``max_running`` attempts at once and at most
    ``rate`` starts in any window of its period, per ``key``.

    ``key``: a callable given the activity's arguments (as called), returning the partition key
    (a ``str`` or ``int``), e.g. ``key=lambda customer, amount: customer``; ``None``: one key.
    ``fair_by``: likewise, the group waiting steps take turns by (default: their workflow
    execution, so one fan-out cannot starve the others). ``priority``: the default priority of
    its steps (lower runs first; a call's ``activity.s(…).set(priority=n)`` overrides it).
    """

    name: str
    max_running: int | None = None
    rate: str | None = None
    key: Callable[..., Any] | None = None
    fair_by: Callable[..., Any] | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigurationError(f"a limit's name is 1-100 of [A-Za-z0-9_.-], not {self.name!r}")
        if self.max_running is None and self.rate is None:
            raise ConfigurationError(f"Limit({self.name!r}) needs max_running=, rate= or both")
        if self.max_running is not None and (
            isinstance(self.max_running, bool) or not isinstance(self.max_running, int) or self.max_running < 1
        ):
            raise ConfigurationError(f"max_running must be an int >= 1, not {self.max_running!r}")
        parse_rate(self.rate)
        for what in ("key", "fair_by"):
            fn = getattr(self, what)
            if fn is not None and not callable(fn):
                raise ConfigurationError(f"Limit({what}=) takes a callable of the activity's arguments, not {fn!r}")
        _check_priority(self.priority)


def _check_priority(priority: object) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        what = f"an int of {priority.bit_length()} bits" if isinstance(priority, int) else type(priority).__name__
        raise ConfigurationError(f"priority must be an int within ±2**53, not {what}")


#: what a marker records: {"name", "key", "max", "rate": [n, per] | None, "p", "g", "d"}
StepLimit = dict[str, Any]


def _key_text(value: Any, what: str, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigurationError(f"Limit({name!r}) {what} must give a str or int, not {type(value).__name__}")
    try:
        text = str(value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        raise ConfigurationError(f"Limit({name!r}) {what} gave an int too long to be a key") from None
    if not text or len(text) > MAX_KEY_CHARS:
        raise ConfigurationError(f"Limit({name!r}) {what} must give 1-{MAX_KEY_CHARS} characters, not {text!r}")
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no store can hold it, none can hash it
        raise ConfigurationError(f"Limit({name!r}) {what} must be encodable as UTF-8: {exc}") from None
    return text


def step_limit(
    limit: Limit,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    execution_id: str,
    priority: int | None,
    at: float = 0.0,
) -> StepLimit:
    """The ``limit`` record of a step scheduled with ``args``/``kwargs`` (in the workflow)."""
    key = "" if limit.key is None else _key_text(limit.key(*args, **kwargs), "key", limit.name)
    group = execution_id if limit.fair_by is None else _key_text(limit.fair_by(*args, **kwargs), "fair_by", limit.name)
    rate = parse_rate(limit.rate)
    if priority is not None:
        _check_priority(priority)
    return {
        "name": limit.name,
        "key": key,
        "max": limit.max_running,
        "rate": list(rate) if rate is not None else None,
        "p": int(limit.priority if priority is None else priority),
        "g": group,
        #: when it was scheduled: the latest scheduled step's declaration is the limit's
        "d": at,
    }


@dataclass(frozen=True)
class WorkflowQueueing:
    """A start's queueing (``options(limit=, limit_key=, priority=)``): which limit its execution
    waits on (``None``: its workflow's declared one), the key (``None``: its limit's key function
    of the arguments) and its priority (``None``: its limit's)."""

    limit: Limit | None = None
    key: str | int | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and not isinstance(self.limit, Limit):
            raise ConfigurationError(f"limit= takes a celery_durable.Limit, not {self.limit!r}")
        if self.key is not None:
            _key_text(self.key, "limit_key", self.limit.name if self.limit is not None else "?")
        if self.priority is not None:
            _check_priority(self.priority)


def workflow_limit(
    declared: Limit | None,
    queueing: WorkflowQueueing | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    group: str,
    at: float,
) -> StepLimit | None:
    """The ``limit`` record of a new execution (computed in the caller of ``start()``, so a bad key
    fails there): the start's limit or its workflow's, keyed by the start's ``limit_key`` or the
    limit's key function of the workflow's arguments; ``None``: not limited. ``group``: whom it
    takes turns with when ``fair_by`` is not given (its parent, for a child; one group for
    top-level starts: first come, first served within a priority)."""
    q = queueing or WorkflowQueueing()
    limit = q.limit or declared
    if limit is None:
        if q.key is not None or q.priority is not None:
            raise ConfigurationError("limit_key= and priority= need a limit (options(limit=) or the workflow's limit=)")
        return None
    record = step_limit(limit if q.key is None else replace(limit, key=None), args, kwargs, group, q.priority, at)
    if q.key is not None:
        record["key"] = _key_text(q.key, "limit_key", limit.name)
    return record


def limit_of_start(
    declared: Limit | None, decode: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], at: float
) -> dict[str, Any]:
    """The fields of an execution started from a stored input (a schedule's tick), as ``start()``
    gives them: ``{"limit": record}`` when its workflow declares a limit (``decode``: its
    arguments, for the key), else nothing. A scheduled start waits on its workflow's limit too."""
    if declared is None:
        return {}
    args, kwargs = decode()
    record = workflow_limit(declared, None, args, kwargs, "", at)
    return {} if record is None else {"limit": record}


def limit_of_stored(definition: Any, payload: Mapping[str, Any], at: float) -> dict[str, Any]:
    """:func:`limit_of_start` for a workflow definition (``None``: not registered here) and its
    encoded input (a schedule's ``payload``)."""
    if definition is None:
        return {}
    return limit_of_start(definition.limit, lambda: definition.codec.decode_args(dict(payload)), at)


def limit_pk(record: Mapping[str, Any]) -> str:
    """The partition of the limit document of ``record``'s name and key (keys are hashed: any
    text is a key, and a partition key cannot hold every character)."""
    digest = hashlib.sha256(str(record["key"]).encode()).hexdigest()[:24]
    return f"lim:{record['name']}:{digest}"


def limit_fields(
    options: Mapping[str, Any] | None, args: tuple[Any, ...], kwargs: Mapping[str, Any], execution_id: str, now: float
) -> dict[str, Any]:
    """The marker fields of a step scheduled with an activity's ``options``: ``{"limit": record}``
    for a limited activity (its key, its priority — a signature's ``.set(priority=n)`` — and its
    group, computed once, in the workflow), else nothing."""
    limit = (options or {}).get("limit")
    if not isinstance(limit, Limit):
        return {}
    return {"limit": step_limit(limit, args, kwargs, execution_id, (options or {}).get("priority"), now)}


#: the limits this process declared, by name: (max_running, rate)
_DECLARED: dict[str, tuple[int | None, str | None]] = {}


def declare_limit(limit: Limit) -> Limit:
    """Note ``limit`` as its name's declaration in this process: a second activity declaring the
    same name with another ``max_running`` or ``rate`` is refused (both share one document per key,
    whose limit would be the one scheduled last). Returns it."""
    seen = _DECLARED.setdefault(limit.name, (limit.max_running, limit.rate))
    if seen != (limit.max_running, limit.rate):
        raise ConfigurationError(
            f"Limit({limit.name!r}) is declared twice: max_running={seen[0]!r}, rate={seen[1]!r} and "
            f"max_running={limit.max_running!r}, rate={limit.rate!r}; one name is one limit (share the Limit object)"
        )
    return limit
