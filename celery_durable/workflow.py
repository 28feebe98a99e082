"""The API used *inside* workflow functions (kept apart from the worker that runs them).

Everything here is deterministic under replay: values are recorded the first time and read
back afterwards. Outside a workflow these raise ``RuntimeError`` (except :func:`in_workflow`).
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from .engine.context import DurableFuture, in_workflow, require_context

__all__ = ["now", "uuid4", "random", "gather", "in_workflow", "DurableFuture", "execution_id"]


def now() -> datetime:
    """The current time, recorded once (timezone-aware UTC)."""
    ctx = require_context("durable.now()")
    ts = ctx.side_effect("now", lambda: ctx.now)
    return datetime.fromtimestamp(float(ts), tz=UTC)


def uuid4() -> _uuid.UUID:
    """A random UUID, recorded once."""
    ctx = require_context("durable.uuid4()")
    return _uuid.UUID(ctx.side_effect("uuid", lambda: str(_uuid.uuid4())))


def random() -> _random.Random:
    """A ``random.Random`` seeded from a recorded seed: same numbers on every replay."""
    return require_context("durable.random()").random()


def gather(*items: Any) -> list[Any]:
    """Fan out, fan in: start every activity (signatures like ``task.s(x)`` or futures) and
    wait for all. Returns results in order; raises the first failure (by position) once all
    have finished. Accepts one iterable or several arguments."""
    ctx = require_context("durable.gather()")
    flat: Iterable[Any] = items[0] if len(items) == 1 and not _is_item(items[0]) else items
    return ctx.gather(flat)


def _is_item(obj: Any) -> bool:
    return isinstance(obj, DurableFuture) or isinstance(getattr(obj, "task", None), str)


def execution_id() -> str:
    """The id of the running execution."""
    return require_context("durable.execution_id()").execution_id
