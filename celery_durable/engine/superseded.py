"""The steps operator actions forgot, decoded from the operation documents that archived them.

``retry``, ``resume`` and ``reset`` delete what a run recorded after some step so it can run
again; :mod:`.oplog` copies those steps (name, state, value or error) into the ``op:`` document
the action writes in the same batch. This module reads them back for ``describe()``, ``durable
show`` and the UI: a compensation that really ran stays visible after a retry, as superseded.
No imports from the rest of the engine but the schema: :mod:`.timeline` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..stores.base import Doc

__all__ = ["SupersededStep", "superseded_of"]


@dataclass(frozen=True)
class SupersededStep:
    """A step an operator action forgot, as it was when forgotten.

    ``state`` is the state it had then (ok, failed, cancelled, ...); ``op`` the id of the
    operation document that forgot it, ``action``/``by``/``at`` that operation's.
    ``value_truncated``: the value was too large to archive whole; ``value`` holds the start of
    its JSON text.
    """

    seq: int
    kind: str
    name: str
    state: str
    run: int = 0
    value: Any = None
    error: str | None = None
    finished_at: float | None = None
    child_id: str | None = None
    value_truncated: bool = False
    op: str = ""
    action: str = ""
    by: str | None = None
    at: float | None = None
    #: the child execution the step was in, deleted with the forgotten step that started it
    #: (None: this execution)
    execution: str | None = None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def superseded_of(operations: tuple[Doc, ...] | list[Doc]) -> tuple[SupersededStep, ...]:
    """Every step archived by ``operations`` (oldest operation first); malformed entries skipped
    (the operation document itself is still listed in ``operations``)."""
    out: list[SupersededStep] = []
    for op in operations:
        out += _entries(op, op.get("forgotten"), None)
        for child in op.get("forgotten_children") or ():
            if isinstance(child, dict):
                out += _entries(op, child.get("forgotten"), _text(child.get("id")))
    return tuple(out)


def _entries(op: Doc, entries: Any, execution: str | None) -> list[SupersededStep]:
    out: list[SupersededStep] = []
    if isinstance(entries, list):  # else a count (operations recorded before the archive) or none
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("seq"), int):
                continue
            out.append(
                SupersededStep(
                    seq=int(e["seq"]),
                    kind=str(e.get("kind") or "?"),
                    name=str(e.get("name") or "?"),
                    state=str(e.get("state") or "?"),
                    run=int(e["run"]) if isinstance(e.get("run"), int) else 0,
                    value=e.get("value"),
                    error=_text(e.get("error")),
                    finished_at=_num(e.get("finished_at")),
                    child_id=_text(e.get("child_id")),
                    value_truncated=bool(e.get("value_truncated")),
                    op=str(op.get("id") or ""),
                    action=str(op.get("action") or ""),
                    by=_text(op.get("by")),
                    at=_num(op.get("at")),
                    execution=execution,
                )
            )
    return out
