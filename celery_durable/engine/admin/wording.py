"""How the operator's tools word things: timestamps, control characters, and the question an
action asks before it forgets recorded steps. Shared by the CLI and the web UI (neither imports the other's)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from celery_durable.engine.admin.oplog import preview
from celery_durable.engine.admin.reset import plan_reset

__all__ = ["escape", "prompt", "ts"]


def escape(text: str) -> str:
    """Control characters (newline, tab, ESC…) as their escapes; printable text unchanged."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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
