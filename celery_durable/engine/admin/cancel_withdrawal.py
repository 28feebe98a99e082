"""Withdrawing a cancel withdraws its cascade (issue 23 item 4; docs/architecture.md §10).

A parent's cancel reaches its pending children (``CANCELLED_BY_PARENT`` on the child's exec) and
their ends reach the parent after it, across partitions no transaction spans. An operation that
reopens the parent (resume; reset of a cancelled execution) plans, from what it read:

* :func:`cascaded`: the recorded ends that cancel caused, forgotten and their steps armed again
  (the children reopened with them), as the cancel's own ``cancelled`` outcomes are;
* :func:`rearm_waiting_children`: the child steps still waiting, made due again for the child scan,
  and the activity steps with no outcome and no attempt running, sent again.

What lands after the plan is the parent's drive's: ``kin.withdrawn_cancels`` and
``kin.stale_child_outcomes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from celery_durable.engine.admin.timeline import _int, _str
from celery_durable.engine.children.holders import is_fence
from celery_durable.engine.documents.model import lease_live
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.documents.schema import (
    CANCELLED_BY_PARENT,
    EXEC_ID,
    DocType,
    DueKind,
    Status,
    StepKind,
    marker_id,
    result_id,
)
from celery_durable.stores.base import Doc, strip_reserved

__all__ = ["cascaded", "ended_by_parent", "rearm_waiting_children"]


class _Rewrite(Protocol):
    deletes: list[Doc]
    replaces: list[Doc]


class _Admin(Protocol):
    @property
    def engine(self) -> Any: ...

    def _rearm(self, ex: ExecDoc, marker: Doc, rewrite: Any, fresh: bool = False) -> None: ...


def ended_by_parent(child: Mapping[str, Any]) -> bool:
    """``child`` ended cancelled by its parent's cancel (or is a fence of it), not an operator's."""
    return child.get("status") == Status.CANCELLED and (bool(child.get(CANCELLED_BY_PARENT)) or is_fence(child))


def cascaded(engine: Any, ex: ExecDoc, docs: dict[str, Doc]) -> list[Doc]:
    """The outcomes of ``ex``'s child steps that its cancel caused: the child, pending when the
    cancel was delivered, was cancelled by it and its end recorded after. Withdrawing the cancel
    withdraws these too: kept, the re-run would fail on a cancel it withdrew."""
    run = _int(ex.get("run"))
    found = []
    for d in docs.values():
        failed = d.get("type") == DocType.RESULT and d.get("ok") is False and not d.get("cancelled")
        if not failed or _int(d.get("run")) != run:
            continue
        marker = docs.get(marker_id(_int(d.get("seq")), run)) or {}
        if marker.get("kind") != StepKind.CHILD or not _str(marker.get("child_id")):
            continue
        if ended_by_parent(engine.store.read(str(marker["child_id"]), EXEC_ID) or {}):
            found.append(d)
    return found


def rearm_waiting_children(admin: _Admin, ex: ExecDoc, docs: dict[str, Doc], rewrite: _Rewrite) -> None:
    """Make the kept child steps that had no outcome when ``ex`` was cancelled due again, so the
    child scan (``Children.check_child``) looks after them once ``ex`` is reopened: a child the cancel
    claimed before it started (a fence) or ended is reopened now, one still running is waited
    for, one that ended otherwise is reported. A cancelled run leaves what it waited for with
    nothing due: without this they stayed pending for ever (stranded)."""
    eng = admin.engine
    run = _int(ex.get("run"))
    taken = {d["id"] for d in rewrite.deletes} | {d["id"] for d in rewrite.replaces}
    for m in list(docs.values()):
        if m.get("type") != DocType.STEP or _int(m.get("run")) != run or m["id"] in taken:
            continue
        if result_id(_int(m.get("seq")), run) in docs:
            continue  # settled
        if m.get("kind") == StepKind.ACTIVITY and not m.get("local"):
            # a kept activity step with no outcome and no attempt running: its message may have
            # been refused while the run was cancelled (or its limit slot handed on): sent again
            if not lease_live(m, eng.clock.now()):
                admin._rearm(ex, m, rewrite)
            continue
        if m.get("kind") != StepKind.CHILD or not _str(m.get("child_id")):
            continue
        if ended_by_parent(eng.store.read(str(m["child_id"]), EXEC_ID) or {}):
            admin._rearm(ex, m, rewrite)
        else:
            due = {"due_kind": DueKind.CHILD, "due_at": eng.clock.now() + eng.settings.activity_queue_timeout}
            rewrite.replaces.append(strip_reserved(m) | due | {"_etag": m["_etag"]})
