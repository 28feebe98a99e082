"""The child executions an operation forgets or reopens: part of its recorded (pending) op.

A retry, resume or reset of a parent deletes the finished children of the steps it forgets (the
re-run, deriving the same ids, starts its own) and retries (or resumes) the failed child of the
step it re-runs. Both used to happen outside the parent's commit: the children were deleted
*before* it (a conflict, a refusal or a kill there lost them with no record), the failed child
retried *after* it (a kill in between let the recovery scan tell the parent the old failure).

Now :func:`.pending_ops.commit` writes the op record (with the children's archive) in its
first batch, the exec document holding the rest as its ``pending_op`` with the ids of these
children; whoever finishes the op (the operator's process, the driver, the recovery scan) runs
:func:`run_children` before the last batch reopens the parent. Each step is idempotent: a
forgotten child already gone is skipped, a child whose op record names this op is not reopened
again. A forgotten child leaves a small ``purged`` document naming the parent's action, so its
id answers where it went (:func:`.oplog.unknown`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_durable.engine.admin.purge import record_id
from celery_durable.engine.admin.reruns import RERUNS, rerun_count
from celery_durable.engine.documents.schema import EXEC_ID, PENDING_OP, DocType, Status
from celery_durable.errors import ConflictError, DurableError, OperationRefused
from celery_durable.stores.base import Doc

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts as Engine

__all__ = ["check_reopen", "register", "resume_child", "run_children"]

log = logging.getLogger("celery_durable.operations")

#: ``(Admin, oplog.cascade)``, registered by engine/admin/operator.py when it is imported (every process
#: of a ``Durable`` app imports it): injected, as the admin commits through this module's caller
_ADMIN: tuple[Callable[[Any], Any], Callable[..., Any]] | None = None


def register(admin: Callable[[Any], Any], cascade: Callable[..., Any]) -> None:
    """Give this module the admin class and the plan that reopens a child (engine/admin/operator.py)."""
    global _ADMIN
    _ADMIN = (admin, cascade)


def run_children(eng: Engine, pk: str, rest: dict[str, Any]) -> None:
    """Forget and reopen the children the op ``rest`` pending on ``pk`` names (before it reopens)."""
    forget, reopen = list(rest.get("forget") or ()), list(rest.get("children") or ())
    if not forget and not reopen:
        return
    if _ADMIN is None:  # never: an op with children was written by the admin, imported with the app
        raise DurableError(f"{pk}: the operation's children need engine/admin/operator.py; import it and try again")
    admin, cascade = _ADMIN[0](eng), _ADMIN[1]
    record: Doc = next((d for d in rest.get("creates") or () if d.get("type") == DocType.OPERATION), {})
    for child in forget:
        _forget(admin, str(child), pk, record)
    for child in reopen:
        _reopen(admin, cascade, str(child), pk, str(rest.get("token")))


#: the statuses a child's reopening applies to: retried when failed, else resumed (a timeout is a cancel)
_REOPENABLE = (Status.FAILED, Status.CANCELLED, Status.TIMED_OUT)


def resume_child(eng: Engine, child: str, parent: str) -> None:
    """Resume ``child``, ended cancelled by a cancel of ``parent`` that an operator withdrew since
    (engine/children/holders.py ``withdrawn_cancels``): recorded on the child like any resume."""
    if _ADMIN is None:  # never in a Durable app's process (it imports engine/admin/operator.py)
        raise DurableError(f"{child}: resuming it needs engine/admin/operator.py; import it")
    _ADMIN[0](eng).resume(child, by=f"via parent {parent}", reason="its parent's cancel was withdrawn")


def check_reopen(admin: Any, child: str) -> None:
    """Refuse (``OperationRefused``, before the parent's op writes anything) reopening ``child``
    when its own retry or resume would be refused now: planned on a fresh read, nothing written.
    Refused only once the parent's record was written, it left the parent's op pending."""
    docs = {d["id"]: d for d in admin.engine.store.query_partition(child).docs}
    ex = docs.get(EXEC_ID)
    if ex is None or ex.get("status") not in _REOPENABLE or ex.get(PENDING_OP):
        return  # nothing to reopen now, or its own op is pending (finished first by its finisher)
    (admin._plan_retry if ex.get("status") == Status.FAILED else admin._plan_resume)(ex, docs)


def _forget(admin: Any, child: str, parent: str, record: Doc) -> None:
    eng = admin.engine
    ex = eng.store.read(child, EXEC_ID)
    if ex is None:  # forgotten already, by an earlier finisher of this op: its pointer too?
        if any(_points(d, parent, record) for d in eng.store.query_partition(child).docs):
            return
        ex, why = {}, 0  # killed between the purge and the pointer: written now, what is known
    else:
        why = admin._purge_one(child, force=True)
        if isinstance(why, str) and admin._status(child) is not None:
            raise OperationRefused(f"child {child} was not forgotten: {why}; try again")
    doc = {
        "pk": child,
        "type": "purged",  # oplog.TOMBSTONE_ID
        "action": f"forgotten by the {record.get('action', 'operation')} of {parent}",
        "parent": parent,
        "op": record.get("id"),
        "by": record.get("by"),
        "at": eng.clock.now(),
        "reason": record.get("reason"),
        "workflow": ex.get("workflow"),
        "status": ex.get("status"),
        RERUNS: rerun_count(ex),  # reruns.reborn
        "documents": why if isinstance(why, int) else 0,
    }
    try:
        for _ in range(5):  # create-only, beside the records already there (an operator's purge)
            try:
                eng.store.create(doc | {"id": record_id(eng.store.query_partition(child).docs)})
                break
            except ConflictError:
                continue
    except DurableError as exc:  # the child is archived in the parent's record: this is a pointer
        log.warning("the forget record of %s was not written: %s", child, exc)
    finally:
        eng.cache.invalidate(child)


def _points(doc: Doc, parent: str, record: Doc) -> bool:
    """``doc`` is the pointer this op of ``parent`` left in a child it forgot."""
    return doc.get("type") == "purged" and (doc.get("parent"), doc.get("op")) == (parent, record.get("id"))


def _reopen(admin: Any, cascade: Callable[..., Any], child: str, parent: str, token: str) -> None:
    docs = admin.engine.store.query_partition(child).docs
    ex = next((d for d in docs if d.get("id") == EXEC_ID), None)
    if ex is None or ex.get("status") not in _REOPENABLE:
        return  # gone, or reopened already (by an earlier finisher of this op, or someone else)
    pending = ex.get(PENDING_OP)
    made = [*docs, *((pending.get("creates") or ()) if isinstance(pending, dict) else ())]
    if any(d.get("type") == DocType.OPERATION and d.get("parent_op") == token for d in made):
        # this op reopened it already (it ran and ended again: its own outcome), or is doing so
        # (the child's own op is pending: its finishers complete it)
        return
    admin._operate(child, cascade(admin, child, parent, token))
