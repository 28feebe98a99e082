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

from celery_durable.engine.documents.model import run_of
from celery_durable.engine.documents.schema import StepKind, result_id, signal_outcome_id
from celery_durable.stores.base import Doc

__all__ = ["SupersededStep", "superseded_of", "version_of", "live_versions", "with_parts"]


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


def with_parts(ops: list[Doc], parts: list[Doc]) -> list[Doc]:
    """The operation documents ``ops``, each with the entries of its archive's part documents
    (``op:<n>.<k>``, in ``parts``) appended to its ``forgotten``: one record an operation."""
    extra: dict[str, list[Doc]] = {}
    for p in parts:
        if isinstance(p.get("op"), str) and isinstance(p.get("forgotten"), list) and isinstance(p.get("part"), int):
            extra.setdefault(p["op"], []).append(p)
    out = []
    for op in ops:
        mine = sorted(extra.get(str(op.get("id")), []), key=lambda p: int(p["part"]))
        if mine and isinstance(op.get("forgotten"), list):
            op = op | {"forgotten": [*op["forgotten"], *(e for p in mine for e in p["forgotten"])]}
        out.append(op)
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def version_of(marker: Doc, by_id: dict[str, Doc], run: int) -> str:
    """The version of a step's record: its outcome's (create-only: a new etag only when taken
    again), else its marker's. A step archived twice (an action cut between its batches, then
    done again) is told from a step taken again at the same number."""
    seq, kind = int(marker["seq"]), marker.get("kind")
    outcome = by_id.get(signal_outcome_id(marker, run) if kind == StepKind.SIGNAL else result_id(seq, run))
    if outcome is None:
        return f"s{marker.get('_etag')}"
    return f"r{outcome.get('_etag')}@{outcome.get('completed_at') or outcome.get('fired_at')}"


def live_versions(docs: list[Doc]) -> set[tuple[int, int, str]]:
    """(run, seq, version) of every step whose documents are in ``docs``."""
    by_id = {str(d.get("id")): d for d in docs}
    out = set()
    for d in docs:
        if d.get("type") == "step" and isinstance(d.get("seq"), int) and isinstance(d.get("run", 0), int):
            try:
                out.add((run_of(d), int(d["seq"]), version_of(d, by_id, run_of(d))))
            except (KeyError, TypeError, ValueError):
                continue  # a malformed marker: describe flags it
    return out


def superseded_of(
    operations: tuple[Doc, ...] | list[Doc], live: set[tuple[int, int, str]] | None = None
) -> tuple[SupersededStep, ...]:
    """Every step archived by ``operations`` (oldest operation first) and no longer recorded as it
    was (``live``: :func:`live_versions` of the partition; an action cut between its batches
    archived steps it did not delete yet); malformed entries skipped."""
    out: list[tuple[SupersededStep, str | None]] = []
    for op in operations:
        out += _entries(op, op.get("forgotten"), None)
        for child in op.get("forgotten_children") or ():
            if isinstance(child, dict):
                out += _entries(op, child.get("forgotten"), _text(child.get("id")))
    # a step archived twice (an action cut between its batches, then done again) is listed once,
    # under the first: the same versions of the same documents (oplog's ``version``)
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for s, version in out:
        key = (s.execution, s.run, s.seq, version)
        if s.execution is None and version is not None and (s.run, s.seq, version) in (live or ()):
            continue  # still there, as archived: not forgotten (yet)
        if version is None or key not in seen:
            seen.add(key)
            unique.append(s)
    return tuple(unique)


def _entries(op: Doc, entries: Any, execution: str | None) -> list[tuple[SupersededStep, str | None]]:
    out: list[tuple[SupersededStep, str | None]] = []
    if isinstance(entries, list):  # else a count (operations recorded before the archive) or none
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("seq"), int):
                continue
            step = SupersededStep(
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
            out.append((step, _text(e.get("version"))))
    return out
