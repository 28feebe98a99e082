"""Child workflows: creating, joining, fencing and cancelling a child, and telling its parent.

A child completes its parent's step by *creating* the step's outcome document, create-only, and
then driving the parent with it, so every writer (the child's end, recovery's check) converges on
one outcome. Who holds a child id is decided by :mod:`celery_durable.engine.children.holders`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.children.holders import (
    child_outcome,
    describe_holder,
    is_child_of,
    is_fence,
    joinable,
    joiners_of,
)
from celery_durable.engine.dispatcher import ChildRequest
from celery_durable.engine.documents.checks import (
    check_exec,
    check_shape,
)
from celery_durable.engine.documents.model import (
    CANCELLED,
    DUE_EXEC,
    EXEC_ID,
    RUNNING,
    create_exec,
    new_exec_doc,
    parse_step_id,
    result_id,
    run_of,
)
from celery_durable.engine.signals.external import send_signal_again
from celery_durable.errors import (
    ConflictError,
    UnknownWorkflowError,
)
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts
from celery_durable.engine.documents.records import ExecDoc, is_terminal, maybe_exec
from celery_durable.engine.drive.upkeep import clear_due, wake

__all__ = ["Children"]

log = logging.getLogger("celery_durable.links")


class Children:
    """The links between parent steps and child executions (docs/architecture.md §7)."""

    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def start_child(self, req: ChildRequest) -> bool:
        """Create the child's execution (idempotent by its id); False when not wanted or taken.

        A child is only created while its parent waits for it: never once the parent has ended,
        continued as new, or recorded an outcome for the step (a cancel delivered before the child
        existed). The parent is looked at again after a creation, so a cancel racing it still
        reaches the child.

        An existing execution under the id is this step's child if it was created for this very
        step (an earlier attempt's create, or its cancel's fence). This parent's child of another
        step or run, of the same workflow and input (the same explicit id started twice), is
        *joined*: the step gets that child's outcome (:meth:`_join`), as DBOS returns a workflow
        id's existing result. Any other holder (an unrelated execution: an explicit id can be
        squatted; this parent's child started with another input) fails the step with
        ``ChildIdTaken`` rather than leave the parent waiting for a child it never gets. Default
        child ids cannot be taken: ``start()`` refuses ids of their form (``check_workflow_id``).
        """
        eng = self.engine
        why = self._child_unwanted(req)
        if why is not None:
            log.warning("child %s of %s not started: %s", req.child_id, req.parent_id, why)
            return False
        parent = {"pk": req.parent_id, "seq": req.seq, "run": req.run}
        queueing = {"limit": req.limit} if isinstance(req.limit, dict) else {}  # it waits for a slot first
        if not eng.create_execution(
            req.workflow, req.payload, req.child_id, parent, deadline_at=req.deadline_at, **queueing
        ):
            existing = maybe_exec(eng.store.read(req.child_id, EXEC_ID))
            if existing is not None and not is_child_of(existing, req.parent_id, req.run, req.seq):
                if self._joinable(existing, req):
                    return self._join(req, existing)
                self._refuse_taken(req, existing)
                return False
            # A fence of a cancel the parent has been resumed past (an operator's resume): start
            # it, if the parent (read again: the fence may be this very race's) still waits.
            fenced = existing is not None and is_fence(existing)
            if not fenced or self._child_unwanted(req, fenced) is not None or not self._revive(existing or {}):
                return True
        why = self._child_unwanted(req)
        if why is not None:
            log.warning("child %s of %s cancelled right after its start: %s", req.child_id, req.parent_id, why)
            try:
                eng.cancel(req.child_id, from_parent=True)
            except UnknownWorkflowError:
                pass
        return True

    def _joinable(self, child: ExecDoc, req: ChildRequest) -> bool:
        """:func:`.holders.joinable`, with the child's input read when it is a document of its
        own. That read comes after the exec's: a child that continued as new (or was purged)
        in between has pruned the input read for; the exec is read again and compared anew,
        never refused for an input that was only gone. A child gone altogether is left to the
        join, which finds it gone and leaves the step to recovery (it starts the child again)."""
        for _ in range(5):
            ref = child.get("payload_at")
            if not isinstance(ref, str):
                return joinable(child, req)
            doc = self.engine.store.read(str(child["pk"]), ref)
            if doc is not None:
                return joinable(child, req, {ref: doc})
            again = maybe_exec(self.engine.store.read(str(child["pk"]), EXEC_ID))
            if again is None:
                return True
            if again.get("_etag") == child.get("_etag"):
                return joinable(child, req)  # its input is really missing: not comparable, not joined
            child = again
        return joinable(child, req)

    def _refuse_taken(self, req: ChildRequest, holder: ExecDoc) -> None:
        """Fail the parent's child step: its id is held by ``holder``, not this step's child.

        Recorded create-only like a child's own outcome, so a retry (recovery after a lost first
        attempt) converges on the same failure, and the parent raises ``ChildWorkflowError``.
        """
        eng = self.engine
        message = f"child workflow id {req.child_id!r} is taken by {describe_holder(holder)}"
        link = holder.get("parent")
        if isinstance(link, dict) and link.get("pk") == req.parent_id and not is_fence(holder):
            other = "another workflow" if holder.get("workflow") != req.workflow else "other input"
            message += f", started with {other} (a child id is joined only with the same workflow and input)"
        log.error("child step %d of %s (run %d) failed: %s", req.seq, req.parent_id, req.run, message)
        doc: Doc = {
            "pk": req.parent_id,
            "id": result_id(req.seq, req.run),
            "type": "result",
            "run": req.run,
            "seq": req.seq,
            "name": req.workflow,
            "child_id": req.child_id,
            "ok": False,
            "value": None,
            "error": {"type": "ChildIdTaken", "message": message},
            "taken": True,
            "completed_at": eng.clock.now(),
        }
        eng.driver.drive(req.parent_id, carry=[doc], release=[req.seq])

    def _join(self, req: ChildRequest, child: ExecDoc) -> bool:
        """Give step ``req`` the outcome of ``child``, this parent's (joinable) child of another step.

        A finished child's outcome is recorded for the step at once. A running child gets the step
        added to its ``joiners`` (etag-guarded, so the write that ends the child, conditional on
        the exec's etag too, either sees it or conflicts and re-reads): :meth:`notify_parent`
        tells every joiner. False when contention or a change of holder left it undone (recovery's
        :meth:`check_child` looks again).
        """
        eng = self.engine
        me = {"pk": req.parent_id, "run": req.run, "seq": req.seq}
        current: ExecDoc | None = child
        for _ in range(20):
            if current is None:
                return False  # gone (purged) meanwhile: recovery starts it again
            if not self._joinable(current, req):
                self._refuse_taken(req, current)
                return False
            if is_terminal(current):
                doc = child_outcome(req.child_id, current, me, eng.clock.now())
                eng.driver.drive(req.parent_id, carry=[doc], release=[req.seq])
                return True
            joiners = joiners_of(current)
            if me in joiners:
                return True
            log.info("child step %d of %s (run %d) joins child %s", req.seq, req.parent_id, req.run, req.child_id)
            try:
                eng.store.replace(strip_reserved(current) | {"joiners": [*joiners, me]}, if_match=current["_etag"])
                return True
            except ConflictError:
                current = check_exec(req.child_id, eng.store.read(req.child_id, EXEC_ID))
        log.warning("child step %d of %s: joining %s failed (contention)", req.seq, req.parent_id, req.child_id)
        return False

    def cancel_child(self, child_id: str, link: tuple[str, int, int]) -> None:
        """Cancel ``child_id`` if it is the child at ``link`` (parent id, run, step), or joined by
        it; an execution that merely holds the id (a taken explicit id) is never cancelled by
        this parent."""
        child = maybe_exec(self.engine.store.read(child_id, EXEC_ID))
        pk, run, seq = link
        if child is None or not (is_child_of(child, *link) or {"pk": pk, "run": run, "seq": seq} in joiners_of(child)):
            return
        parent = self.engine.store.read(pk, EXEC_ID) or {}
        if not parent.get("cancel_requested") or run_of(parent) != run:
            # the parent's cancel was withdrawn since (an operator's resume or reset reopened it,
            # and waits for this child again) or its run moved on: a late cancel must not fail it
            log.info("cancel of child %s not sent on: %s no longer cancels run %d", child_id, pk, run)
            return
        try:
            self.engine.cancel(child_id, from_parent=True)
        except UnknownWorkflowError:
            pass

    def _revive(self, fence: Mapping[str, Any]) -> bool:
        """Turn a fence into the running child it stood for (etag-guarded); False if it changed."""
        eng = self.engine
        now = eng.clock.now()
        body = {k: v for k, v in strip_reserved(fence).items() if k != "fence"}
        body.update(status=RUNNING, cancel_requested=False, error=None, completed_at=None, parent_notified=None)
        body.update(
            incarnation=uuid.uuid4().hex, updated_at=now, due_kind=DUE_EXEC, due_at=now + eng.settings.drive_timeout
        )
        try:
            eng.store.replace(body, if_match=fence["_etag"])
        except ConflictError:
            return False
        eng.cache.invalidate(str(fence["pk"]))
        eng.emit("workflow_started", execution_id=fence["pk"], workflow=fence["workflow"])
        eng.dispatcher.send_drive(str(fence["pk"]))
        return True

    def fence_children(self, parent: Mapping[str, Any], markers: list[Doc]) -> None:
        """Before a drive commits the cancel of pending child steps: claim each child's id.

        A child is created after its parent's commit, in another partition, by a creator that
        checked the parent first; a cancel committed between that check and the create would
        leave a live child of a cancelled parent (no transaction spans both partitions). So the
        cancelling drive first creates, create-only, a *cancelled* exec under the child's id:
        first writer wins, either the child exists (and the cancel sent after the commit
        reaches it) or the late creator finds the id taken and creates nothing. Done before the
        commit so the parent is still running whenever a child document appears; if the commit
        then loses, the fence is still right: ``cancel_requested`` is never cleared, and a child
        step's only other outcome comes from the (never started) child itself.
        """
        eng = self.engine
        now = eng.clock.now()
        for marker in markers:
            name = str(marker["name"])
            wf = eng.registry.workflow(name)
            fence = new_exec_doc(
                str(marker["child_id"]),
                name,
                marker.get("input") or {},
                {"pk": parent["pk"], "seq": int(marker["seq"]), "run": run_of(parent)},
                wf.signal_names if wf is not None else None,
                now,
                status=CANCELLED,
                cancel_requested=True,
                error={"type": "WorkflowCancelledError", "message": "the parent was cancelled before it started"},
                completed_at=now,
                # not a child's outcome: the parent records its own cancelled outcome for the step
                fence=True,
                parent_notified=True,
            )
            create_exec(eng.store, fence)  # its large input apart, as any exec's: a resume may revive it

    def _child_unwanted(self, req: ChildRequest, fenced: bool = False) -> str | None:
        """Why the parent no longer waits for this child (None: it does). A ``fenced`` child
        (its id claimed by a cancel) is wanted again only once the cancel was withdrawn."""
        docs = self.engine.cache.load(req.parent_id)
        ex = check_exec(req.parent_id, docs.get(EXEC_ID))
        if ex is None:
            return "the parent does not exist"
        if is_terminal(ex):
            return f"the parent is {ex['status']}"
        if fenced and ex.get("cancel_requested"):
            return "the parent is being cancelled"
        if run_of(ex) != req.run:
            return "the parent continued as new"
        outcome = docs.get(result_id(req.seq, req.run))
        if outcome is not None and (outcome.get("child_id") != req.child_id or outcome.get("taken")):
            why = " (cancelled)" if outcome.get("cancelled") else " (the id is taken)" if outcome.get("taken") else ""
            return "the parent's step already has an outcome" + why
        return None

    def notify_parent(self, child_id: str) -> None:
        """Record a finished child's outcome in its parent (for its step and every step that
        joined it) and drive the parent."""
        eng = self.engine
        child = check_exec(child_id, eng.store.read(child_id, EXEC_ID))
        parent = None if child is None else child.get("parent")
        if child is None or not is_terminal(child) or not parent or is_fence(child):
            return
        now = eng.clock.now()
        docs = [child_outcome(child_id, child, link, now) for link in [parent, *joiners_of(child)]]
        for pk in dict.fromkeys(str(d["pk"]) for d in docs):  # one drive per parent (joiners share it)
            mine = [d for d in docs if d["pk"] == pk]
            eng.driver.drive(pk, carry=mine, release=[int(d["seq"]) for d in mine])
        for _ in range(20):
            try:
                eng.store.replace(
                    strip_reserved(child) | {"parent_notified": True, "due_kind": None, "due_at": None}, child["_etag"]
                )
                return
            except ConflictError:
                child = maybe_exec(eng.store.read(child_id, EXEC_ID))
                if child is None or child.get("parent_notified"):
                    return

    def check_child(self, parent_id: str, marker: Doc) -> None:
        """Recovery for a child step still pending after its deadline: start it if it never
        was (and the parent still waits for it), tell the parent if it finished, otherwise look
        again later. A step the parent no longer waits for leaves the scan."""
        eng = self.engine
        check_shape(parent_id, marker)
        if marker.get("kind") == "signal_send":
            send_signal_again(eng, eng.signals.signal, parent_id, marker)
            return
        child_id = str(marker["child_id"])
        run, seq = parse_step_id(marker["id"])
        deadline, queueing = marker.get("deadline_at"), marker.get("child_limit")
        req = ChildRequest(
            parent_id, seq, str(marker["name"]), dict(marker.get("input") or {}), child_id, run, deadline, queueing
        )
        child = check_exec(child_id, eng.store.read(child_id, EXEC_ID))
        if child is not None and not is_child_of(child, parent_id, run, seq):
            # the id is held by another execution: joined if it is this parent's same child,
            # else the step fails (never cancelled); a join left undone stays due
            if self._child_unwanted(req) is None:
                if not self._joinable(child, req):
                    self._refuse_taken(req, child)
                elif not self._join(req, child):
                    return
            clear_due(self.engine, marker)
            return
        if child is not None and is_fence(child) and self._child_unwanted(req, fenced=True) is None:
            child = None  # the parent waits for it again (resumed by an operator): start it
        if child is not None and is_terminal(child):
            if is_fence(child):
                wake(self.engine, parent_id)  # never a real outcome: the parent's cancel drive records the step's
            else:
                self.notify_parent(child_id)
                if eng.store.read(parent_id, result_id(seq, run)) is None:
                    # not taken: a cancelled end of a cancel the parent withdrew, whose child could
                    # not be resumed yet (a step of it still running): ask again later
                    self._push_due(marker)
                    return
            clear_due(self.engine, marker)
            return
        why = self._child_unwanted(req)
        if why is not None:
            parent = eng.store.read(parent_id, EXEC_ID) or {}
            outcome = eng.store.read(parent_id, result_id(seq, run)) or {}
            if child is not None and (parent.get("status") == CANCELLED or outcome.get("cancelled")):
                eng.cancel(child_id, from_parent=True)  # the parent's cancel message to it was lost
            clear_due(self.engine, marker)
            return
        if child is None:
            self.start_child(req)
        self._push_due(marker)

    def _push_due(self, marker: Doc) -> None:
        eng = self.engine
        pushed = strip_reserved(marker) | {"due_at": eng.clock.now() + eng.settings.activity_queue_timeout}
        try:
            eng.store.replace(pushed, if_match=marker["_etag"])
        except ConflictError:
            pass
