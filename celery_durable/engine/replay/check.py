"""A replay check before a deploy (``durable replay-check``, ``celery_durable.testing.replay``).

Each execution's recorded history is replayed *read-only* against the workflow code installed in
this process, exactly as the next drive would replay it (engine/replay/history.py: pure, nothing
written or sent), and the replay is compared with the history:

- **compatible**: the code takes the recorded steps in order (a running execution may go on past
  them: new steps are what it would do next);
- **incompatible**: the code takes another step than the one recorded (the first diverging step,
  with what the history has and what the code now calls), returns before the recorded steps end,
  or takes a step an ended execution never took: the next drive of a running execution would fail
  with ``NonDeterminismError``. The fix is ``wf.patched("change-id")`` around the change at that step
  (executions past it keep the old path) or letting old executions finish first;
- **fails**: the replay of the recorded steps raises in the workflow code (a running execution
  would fail at its next drive);
- **unknown**: its workflow is not registered in this process (the check imports nothing);
- **unreadable**: a document of its partition is corrupt.

A history is the partition's documents: read from a live store, or from ``durable export``'s
JSON (:func:`export_history`, :func:`docs_of`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from celery_durable.engine.admin.terminate import TERMINATED
from celery_durable.engine.documents.checks import check_shape
from celery_durable.engine.documents.model import EXEC_ID, marker_id
from celery_durable.engine.documents.records import count_of, is_terminal, maybe_exec, run_of
from celery_durable.engine.documents.schema import Status
from celery_durable.engine.outcomes import ReplayKind
from celery_durable.engine.replay.history import replay
from celery_durable.errors import CorruptDocument, StoreError
from celery_durable.stores.base import Doc, ExecFilter, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts
    from celery_durable.engine.registry import Registry
    from celery_durable.settings import Settings

__all__ = ["FORMAT", "Verdict", "ReplayVerdict", "check_history", "check_all", "export_history", "docs_of"]

#: the ``format`` of an exported history (``durable export``)
FORMAT = "celery_durable.history/1"
_STEP = re.compile(r"step (\d+)")
_CALLS = re.compile(r"the history has (.+?) but the code now calls (.+?)(?: \(|$)")
_RETURNED = re.compile(r"returned after (\d+) steps but the history has (\d+)")


class Verdict(StrEnum):
    COMPATIBLE = "compatible"
    INCOMPATIBLE = "incompatible"
    FAILS = "fails"
    UNKNOWN = "unknown"
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class ReplayVerdict:
    """One execution's replay against the installed code."""

    execution_id: str
    workflow: str
    #: the execution's stored status
    status: str
    verdict: Verdict
    #: the first step where the code leaves the history (None: it does not)
    step: int | None = None
    #: what the history records at ``step`` and what the code now does there
    history: str | None = None
    code: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == Verdict.COMPATIBLE

    @property
    def hint(self) -> str | None:
        """What to do about it, for an incompatible one."""
        if self.verdict != Verdict.INCOMPATIBLE:
            return None
        at = f" at step {self.step}" if self.step is not None else ""
        return (
            f"needs wf.patched(...) around the change{at} (executions past it keep the old path), "
            "or let executions started before the change end first"
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": str(self.verdict), "hint": self.hint}


def export_history(docs: Mapping[str, Doc]) -> dict[str, Any]:
    """``durable export``'s JSON of one execution: its partition's documents as stored."""
    ex = docs.get(EXEC_ID) or {}
    return {
        "format": FORMAT,
        "execution_id": ex.get("pk"),
        "workflow": ex.get("workflow"),
        "docs": [strip_reserved(d) for _, d in sorted(docs.items())],
    }


def docs_of(exported: Mapping[str, Any]) -> dict[str, Doc]:
    """The partition of an exported history; ValueError when it is not one."""
    if not isinstance(exported, Mapping) or exported.get("format") != FORMAT:
        raise ValueError(f'not an exported history (no "format": {FORMAT!r})')
    docs = exported.get("docs")
    if not isinstance(docs, list) or not all(isinstance(d, dict) and isinstance(d.get("id"), str) for d in docs):
        raise ValueError('an exported history\'s "docs" must be a list of documents with an "id"')
    # each as it would be read (an etag is what the replay never looks at)
    return {str(d["id"]): dict(d) | {"_etag": "exported"} for d in docs}


#: what the replay of an ended execution must end as, by its stored status
_ENDS = {
    Status.COMPLETED: ReplayKind.COMPLETED,
    Status.FAILED: ReplayKind.FAILED,
    Status.CANCELLED: ReplayKind.CANCELLED,
    Status.TIMED_OUT: ReplayKind.TIMED_OUT,
}


def check_history(docs: Mapping[str, Doc], registry: Registry, settings: Settings, now: float) -> ReplayVerdict:
    """Replay one execution's ``docs`` read-only against ``registry``'s code; its verdict."""
    ex = maybe_exec(docs.get(EXEC_ID))
    if ex is None:
        return ReplayVerdict("?", "?", "?", Verdict.UNREADABLE, detail="no exec document in the history")
    eid, name, status = str(ex.get("pk")), str(ex.get("workflow")), str(ex.get("status"))
    verdict = functools.partial(ReplayVerdict, eid, name, status)
    try:  # every document: an ended execution's steps are replayed too (a drive checks only its exec)
        for doc in docs.values():
            check_shape(eid, doc)
    except CorruptDocument as exc:
        return verdict(Verdict.UNREADABLE, detail=str(exc))
    definition = registry.workflow(name)
    if definition is None:
        return verdict(Verdict.UNKNOWN, detail=f"workflow {name!r} is not registered in this process")
    recorded = count_of(ex, "steps")
    if recorded == 0 and status in (Status.CANCELLED, Status.TIMED_OUT):
        return verdict(Verdict.COMPATIBLE, detail="ended before any of its code ran")
    try:
        result = replay(ex, dict(docs), definition, registry, now, settings, read_only=True)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - sys.exit() in workflow code: its verdict, not the check's end
        return verdict(Verdict.FAILS, detail=f"the replay raised {type(exc).__name__}: {exc}")
    error = result.error or {}
    if result.kind == ReplayKind.FAILED and error.get("type") == "NonDeterminismError":
        return _diverged(verdict, str(error.get("message", "")), recorded)
    # a terminated execution ended where it waited: replayed, it waits there again
    ended = is_terminal(ex) and (ex.get("error") or {}).get("type") != TERMINATED
    if result.kind == ReplayKind.SUSPENDED and result.steps < recorded:
        # the unchanged code would take every recorded step before waiting (outcomes only accumulate)
        nxt = result.steps + 1
        marker = docs.get(marker_id(nxt, run_of(ex))) or {}
        return verdict(
            Verdict.INCOMPATIBLE,
            nxt,
            f"{marker.get('kind')} {marker.get('name')!r}",
            "waits before it",
            detail=f"the code waits at step {result.steps}, before step {nxt} the history took then",
        )
    invented = [d for d in (result.context.new_docs.values() if result.context else []) if d.get("kind") != "patch"]
    if ended and (result.kind == ReplayKind.SUSPENDED or invented):
        first = min((int(d.get("seq") or 0) for d in invented), default=result.steps + 1)
        what = next((f"{d.get('kind')} {d.get('name')!r}" for d in invented if int(d.get("seq") or 0) == first), None)
        return verdict(
            Verdict.INCOMPATIBLE,
            first,
            "the end of the execution",
            what or "waits",
            detail=f"the code takes step {first}, which this {status} execution never took",
        )
    if ended and result.kind != _ENDS.get(Status(status)):
        why = f": {error.get('type')}: {error.get('message')}" if error else ""
        return verdict(Verdict.FAILS, detail=f"this {status} execution's replay now ends {result.kind}{why}")
    if result.kind == ReplayKind.FAILED and not ended:
        return verdict(Verdict.FAILS, detail=f"{error.get('type')}: {error.get('message')}")
    return verdict(Verdict.COMPATIBLE)


def _diverged(verdict: Any, message: str, recorded: int) -> ReplayVerdict:
    """The verdict of a replay that met ``NonDeterminismError`` (its message names the step)."""
    returned = _RETURNED.search(message)
    if returned is not None:
        end = int(returned.group(1)) + 1
        return cast(
            ReplayVerdict,
            verdict(Verdict.INCOMPATIBLE, end, f"step {end} and on ({recorded} steps)", "returns", detail=message),
        )
    step_m, calls = _STEP.search(message), _CALLS.search(message)
    history, code = (calls.group(1), calls.group(2)) if calls else (None, None)
    step = int(step_m.group(1)) if step_m else None
    return cast(ReplayVerdict, verdict(Verdict.INCOMPATIBLE, step, history, code, detail=message))


def _exported(item: str | Path | Mapping[str, Any]) -> dict[str, Doc]:
    if isinstance(item, Mapping):
        return docs_of(item)
    with open(item, encoding="utf-8") as f:
        try:
            return docs_of(json.load(f))
        except (ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"{item}: {exc}") from None


def check_all(
    eng: EngineParts,
    histories: Iterable[str | Path | Mapping[str, Any]] | None = None,
    workflow: str | None = None,
    status: str | None = "running",
    limit: int = 1000,
) -> Iterator[ReplayVerdict]:
    """The verdict of each history: ``histories`` (exported: paths or their parsed JSON; a bad
    one is a ValueError naming it), or when ``None`` the store's executions of ``workflow`` with
    ``status`` (``None``: any), newest first, at most ``limit`` (one partition read each)."""
    now = eng.clock.now()
    if histories is not None:
        for item in histories:
            yield check_history(_exported(item), eng.registry, eng.settings, now)
        return
    cursor: str | None = None
    left = limit
    while left > 0:
        page = eng.store.list_execs(ExecFilter(workflow, status), min(500, left), cursor)
        for ex in page.docs:
            try:
                docs = {d["id"]: d for d in eng.store.query_partition(str(ex["pk"])).docs}
            except (CorruptDocument, StoreError) as exc:  # one unreadable partition: its verdict only
                yield ReplayVerdict(
                    str(ex.get("pk")),
                    str(ex.get("workflow")),
                    str(ex.get("status")),
                    Verdict.UNREADABLE,
                    detail=str(exc),
                )
                continue
            if EXEC_ID in docs:  # not purged since it was listed
                yield check_history(docs, eng.registry, eng.settings, now)
        left -= len(page.docs)
        cursor = page.cursor
        if cursor is None or not page.docs:
            return
