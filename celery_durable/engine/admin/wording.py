"""How the operator's tools word things: timestamps, control characters, and the question an
action asks before it forgets recorded steps. Shared by the CLI and the web UI (neither imports the other's)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from celery_durable.engine.admin.oplog import preview
from celery_durable.engine.admin.reset import plan_reset

__all__ = ["escape", "iso", "parse_age", "prompt", "ts"]


def escape(text: str) -> str:
    """Control characters (newline, tab, ESC…) as their escapes; printable text unchanged."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` (or plain seconds) → seconds; ValueError otherwise
    (the CLI's ``--older-than`` and the UI's filters alike)."""
    m = _AGE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not an age like 30s, 15m, 2h, 7d or 1w")
    return float(m.group(1)) * _UNITS[m.group(2)]


def iso(value: Any) -> Any:
    """Epoch seconds as an ISO 8601 UTC string (``2026-12-04T20:31:05.120000+00:00``), for JSON
    output; ``None`` and non-numbers as they are; a corrupt number (non-finite, out of range) as
    ``"invalid (<value>)"``: JSON has no ``Infinity``, and a parser must never be handed one."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    try:
        return datetime.fromtimestamp(value, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return f"invalid ({value!r})"


def ts(value: Any) -> str:
    """Epoch seconds as UTC ``YYYY-MM-DD HH:MM:SS``; ``-`` if absent, ``invalid (…)`` if out of range.

    A corrupt document can hold any number (``1e30``, ``NaN``): shown, never fatal."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not value:
        return "-"
    try:
        if not math.isfinite(value):
            raise ValueError(value)
        return datetime.fromtimestamp(float(value), tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"invalid ({value!r})"


def prompt(admin: Any, execution_id: str, action: str, head: str, step: int | None = None) -> str:
    """``head`` and, below it, the steps ``action`` will forget (the ones that ran flagged)."""

    def reset(ex: Any, docs: Any, rewrite: Any) -> None:
        plan_reset(admin, rewrite, ValueError, ex, docs, int(step or 0), "preview", None)

    try:
        forgets = preview(admin, execution_id, action, reset if action == "reset" else None)
    except Exception as exc:  # the operation itself refuses (and says why) after the prompt
        forgets = [f"  (cannot tell what it forgets: {exc})"]
    if not forgets:
        return head
    return "\n".join(
        [f"{head}", "it forgets these recorded steps (kept in the record as superseded):", *forgets, "go on?"]
    )
