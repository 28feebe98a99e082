"""Who holds a child id: the links between a parent step and the child execution under an id.

Pure functions over exec documents, used by :mod:`.links` (start, join, refuse, notify, cancel).
A child is *of* a step when it was created (or fenced) for it; it is *joined* by the other steps
of the same parent that started the same explicit id with the same workflow and input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_durable.codecs import same_json
from celery_durable.engine.admin.reruns import rerun_count
from celery_durable.engine.dispatcher import ChildRequest
from celery_durable.engine.documents.model import CANCELLED, COMPLETED, marker_id, payload_of, result_id, run_of
from celery_durable.engine.documents.records import ExecDoc, is_terminal
from celery_durable.engine.documents.schema import CANCELLED_BY_PARENT
from celery_durable.errors import CorruptDocument
from celery_durable.stores.base import Doc

__all__ = [
    "CHILD_RERUNS",
    "cancelled_child_steps",
    "is_child_of",
    "joinable",
    "joiners_of",
    "child_outcome",
    "describe_holder",
    "is_fence",
    "stale_child_outcomes",
    "withdrawn_cancels",
]


def is_child_of(child: ExecDoc, parent_id: str, run: int, seq: int) -> bool:
    """Whether ``child`` was created (or fenced) for step ``seq`` of run ``run`` of ``parent_id``."""
    link = child.get("parent")
    if not isinstance(link, dict):
        return False
    try:
        return link.get("pk") == parent_id and run_of(link) == run and int(link["seq"]) == seq
    except (KeyError, TypeError, ValueError):
        return False


def joinable(child: ExecDoc, req: ChildRequest, inputs: Mapping[str, Mapping[str, Any]] | None = None) -> bool:
    """Whether step ``req`` may join ``child``: this parent's child (of any step or run, not a
    fence) of the same workflow and input. Another input would silently give the step a result
    computed from other arguments (as Stripe refuses a reused idempotency key): refused instead.
    ``inputs``: the child's input document, when its input is one (``payload_at``); missing, the
    input cannot be compared and the step does not join."""
    link = child.get("parent")
    if not (
        isinstance(link, dict)
        and link.get("pk") == req.parent_id
        and not is_fence(child)
        and child.get("workflow") == req.workflow
    ):
        return False
    try:
        return same_json(payload_of(child, inputs or {}), req.payload)
    except CorruptDocument:
        return False


def joiners_of(child: ExecDoc) -> list[dict[str, Any]]:
    """The parent steps that joined ``child`` (``{"pk", "run", "seq"}``; shape checked by ``check_exec``)."""
    return [dict(j) for j in child.get("joiners") or []]


def child_outcome(child_id: str, child: ExecDoc, link: Mapping[str, Any], now: float) -> Doc:
    """The outcome document of the parent step at ``link`` for the finished ``child``."""
    seq, run = int(link["seq"]), run_of(link)
    status = child["status"]
    err = child.get("error") or {}
    if status == CANCELLED:
        err = {"type": "WorkflowCancelledError", "message": f"child {child_id!r} was cancelled"}
    return {
        "pk": link["pk"],
        "id": result_id(seq, run),
        "type": "result",
        "run": run,
        "seq": seq,
        "name": child.get("workflow"),
        "child_id": child_id,
        "ok": status == COMPLETED,
        "value": child.get("result"),
        "error": None if status == COMPLETED else err,
        "completed_at": now,
        # which life of the child ended so (stale_child_outcomes): an operator may reopen it
        CHILD_RERUNS: rerun_count(child),
        # ended by its parent's cancel (withdrawn_cancels)
        CANCELLED_BY_PARENT: status == CANCELLED and bool(child.get(CANCELLED_BY_PARENT)),
    }


def withdrawn_cancels(ex: ExecDoc, docs: dict[str, Doc], carry: list[Doc]) -> dict[int, str]:
    """Step -> child of the outcomes in ``carry`` that record a cancel of ``ex``'s own that an
    operator has withdrawn since (resume, reset): the child, pending when ``ex`` was cancelled,
    ended cancelled by it, but ``ex`` runs again and waits for the step. Recorded, the step would
    fail on a cancel nobody wants any more; the child is resumed instead (``Engine.reopen_child``).
    The caller's commit is conditional on ``ex``'s etag, which that operation changed. An ``ex``
    that has ended since waits for nothing: the end is recorded as it is, the child left alone."""
    if ex.get("cancel_requested") or is_terminal(ex):
        return {}
    run = run_of(ex)
    return {
        int(d["seq"]): str(d["child_id"])
        for d in carry
        if d.get("type") == "result"
        and d.get(CANCELLED_BY_PARENT)
        and run_of(d) == run
        and isinstance(d.get("seq"), int)
        and result_id(int(d["seq"]), run) not in docs
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


#: the field of a child step's marker (the child's reruns an operation that reopens it expects)
#: and of a child's outcome (the reruns of the child that ended so)
CHILD_RERUNS = "child_reruns"


def stale_child_outcomes(docs: dict[str, Doc], run: int, carry: list[Doc]) -> set[int]:
    """The steps of the child outcomes in ``carry`` that an earlier life of their child reached:
    an operation reopened the child (resume, retry, reset of the parent) after its end was read,
    and its marker expects a later one. Recorded, the old end would decide the step the reopened
    child is running for. The caller's commit is conditional on the parent's exec etag, which
    that operation changed, so this check and that write are one."""
    stale = set()
    for d in carry:
        seq = d.get("seq")
        if d.get("type") != "result" or "child_id" not in d or not isinstance(seq, int) or run_of(d) != run:
            continue
        marker = docs.get(marker_id(seq, run)) or {}
        if _count(d.get(CHILD_RERUNS)) < _count(marker.get(CHILD_RERUNS)):
            stale.add(seq)
    return stale


def describe_holder(ex: ExecDoc) -> str:
    what = f"an execution of {ex.get('workflow')!r} ({ex.get('status')})"
    link = ex.get("parent")
    if isinstance(link, dict) and link.get("pk"):
        return f"{what} that is the child of {link['pk']!r} (run {link.get('run') or 0}, step {link.get('seq')})"
    return f"{what} that has no parent"


def is_fence(child: Mapping[str, Any]) -> bool:
    """A child id claimed by its parent's cancel (``Children.fence_children``) and never run. Once an
    operator resumes it (resuming the parent resumes its cancelled children) it is driven and
    is a real child whose outcome its parent is told."""
    return bool(child.get("fence")) and not child.get("drives")


def cancelled_child_steps(docs: Mapping[str, Doc], run: int, cancels: set[str]) -> list[Doc]:
    """The child steps of ``run`` whose children (``cancels``) a replay cancels, to fence.

    Only steps already committed: a child step this replay itself takes is committed with its
    cancelled outcome, which its creator then finds (and a stale replay's fence of a step that
    never commits would outlive it).
    """
    return [
        d
        for d in docs.values()
        if d.get("type") == "step"
        and d.get("kind") == "child"
        and d.get("run", 0) == run
        and d.get("child_id") in cancels
    ]
