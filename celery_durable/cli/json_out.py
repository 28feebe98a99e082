"""What ``--json`` prints: the fields the tables show, as JSON, with every timestamp (a field
named ``at``, ``until`` or ``…_at``) an ISO 8601 UTC string rather than epoch seconds. Each command prints
one JSON document (``list`` and ``outbox list``: one per line), on stdout, nothing else."""

from __future__ import annotations

import json
from typing import Any

import click

from celery_durable.engine.admin.wording import iso

__all__ = ["echo", "jsonable", "needs_yes"]


#: fields holding the user's values (inputs, results, statuses, attributes, what a step recorded):
#: printed exactly as stored, whatever their keys are called
USER_VALUES = frozenset(
    {"payload", "result", "value", "input", "custom_status", "search", "memo", "args", "kwargs", "forgotten", "answer"}
)


def _times(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: v if k in USER_VALUES else _times(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_times(v) for v in value]
    if key is not None and (key in ("at", "until") or key.endswith("_at")):
        return iso(value)
    return value


def _invalid(constant: str) -> str:
    return f"invalid ({constant})"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON (anything else by its ``str``), timestamps as ISO strings; a
    corrupt non-finite number as ``"invalid (Infinity)"``: JSON has no such token."""
    return _times(json.loads(json.dumps(value, default=str), parse_constant=_invalid))


def echo(value: Any, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(jsonable(value), indent=indent, allow_nan=False))


def needs_yes(as_json: bool, yes: bool) -> None:
    """A script reading ``--json`` cannot answer a prompt: it says ``--yes`` too."""
    if as_json and not yes:
        raise click.UsageError("--json needs --yes (a script cannot answer the confirmation)")
