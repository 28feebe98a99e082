"""Timers, signals and child workflows: the engine operations behind ``docs/architecture.md``.

Timers and children complete a step by *creating* its outcome document, create-only, and then
driving the execution with it (the driver's carry). Several writers (the fast-path countdown,
beat's clock scan, two beats by mistake) therefore converge on one outcome: the first writer wins
and the others find it recorded.

Signals are values *sent* to an execution (``sgv:<n>``, recorded atomically with the exec) and
*consumed* one by one by the replays of successive waits, each recording its own decision
``w<run>:<seq>`` create-only; see :meth:`Links.signal`.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.cache import bump_generation
from celery_durable.engine.checks import SIGNAL_MARK_PREFIX, check_doc, check_exec, check_partition, signal_value_id
from celery_durable.engine.dispatcher import ChildRequest, SignalRequest
from celery_durable.engine.kin import child_outcome, describe_holder, is_child_of, is_fence, joinable, joiners_of
from celery_durable.engine.model import (
    CANCELLED,
    DUE_CLOCK,
    DUE_EXEC,
    EXEC_ID,
    RUNNING,
    TERMINAL,
    marker_id,
    new_exec_doc,
    parse_step_id,
    result_id,
    settled,
)
from celery_durable.engine.oplog import signal_op
from celery_durable.engine.outbox.model import DUE_ADMIT
from celery_durable.engine.schema import DocType, run_prefixes, signal_key_id, signal_outcome_id
from celery_durable.engine.sends import send_signal, send_signal_again
from celery_durable.errors import (
    ConflictError,
    CorruptDocument,
    DurableError,
    PayloadValidationError,
    UnknownWorkflowError,
)
from celery_durable.stores.base import Doc, Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.parts import EngineParts
    from celery_durable.engine.registry import WorkflowDef

__all__ = ["Links", "declared_signals"]

log = logging.getLogger("celery_durable.links")


def declared_signals(ex: Doc, wf: WorkflowDef | None) -> list[str] | None:
    """The signal names an execution accepts, or ``None`` for any name.

    The starter records them in the exec document (``signals``); a workflow declaring none
    accepts any name, typed by ``wait_signal(name, type)`` where it is consumed. An exec
    written before names were recorded falls back to the local definition, if any.
    """
    if "signals" in ex:
        names = ex.get("signals")
        return list(names) if names else None
    return wf.signal_names if wf is not None else None


class Links:
    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    # --- timers ---------------------------------------------------------------------------

    def fire_clock(self, execution_id: str, seq: int, run: int = 0) -> str:
        """Fire a due timer (a sleep, or a signal wait's timeout). Idempotent.

        A signal wait's timeout records the fact that the timer fired (``r:<seq>``, with the
        number of signal values sent so far); the replay decides that wait (and only that one): a
        valid value sent before the timer fired still wins, a later one is left for the next wait.
        A clock whose step is no longer a timer (forgotten by an operator's retry or resume and
        taken again by another step) fires nothing.
        """
        eng = self.engine
        docs = eng.cache.load(execution_id)
        check_partition(execution_id, docs)
        ex = docs.get(EXEC_ID)
        marker = docs.get(marker_id(seq, run))
        if ex is None or marker is None:
            return "missing"
        kind = marker.get("kind")
        if kind == "activity" and marker.get("local") and marker.get("fire_at") is not None:
            return self._fire_local_retry(ex, marker, docs, seq, run)
        if kind not in ("sleep", "signal") or marker.get("fire_at") is None:
            return "missing"
        done = result_id(seq, run) in docs or (kind == "signal" and signal_outcome_id(marker, run) in docs)
        if ex.get("status") in TERMINAL or done or int(ex.get("run") or 0) != run:
            self._clear_due(marker)
            return "done"
        now = eng.clock.now()
        fire_at = float(marker.get("fire_at") or 0.0)
        if now < fire_at:
            return "early"
        doc: Doc = {"pk": execution_id, "id": result_id(seq, run), "type": "result", "run": run, "seq": seq}
        if kind == "signal":
            signals_seen = int(ex.get("signal_seq") or 0)
            doc.update(name=marker["name"], ok=False, timeout=True, signals_seen=signals_seen, fired_at=now)
        else:
            doc.update(ok=True, value=None, fired_at=now)
        eng.emit("timer_fired", execution_id=execution_id, seq=seq, lateness=now - fire_at)
        eng.driver.drive(execution_id, carry=[doc], release=[seq])
        return "fired"

    def _fire_local_retry(self, ex: Doc | None, marker: Doc, docs: dict[str, Doc], seq: int, run: int) -> str:
        """A local activity's retry timer (a backoff too long to wait in the drive): drive, and
        the drive runs the next attempt in its process (``engine/local_steps.py``)."""
        if ex is None or ex.get("status") in TERMINAL or result_id(seq, run) in docs or int(ex.get("run") or 0) != run:
            self._clear_due(marker)
            return "done"
        if self.engine.clock.now() < float(marker["fire_at"]):
            return "early"
        self.engine.driver.drive(str(ex["pk"]))
        return "fired"

    def fire_due_clocks(self, limit: int = 500) -> int:
        """Beat's clock scan: fire everything due (including clocks whose fast path was lost).

        One bad execution never stops the scan: a malformed document fails its own execution.
        """
        fired = 0
        for ref in self.engine.store.scan_due(DUE_CLOCK, self.engine.clock.now(), limit):
            try:
                run, seq = parse_step_id(ref.id)
                if self.fire_clock(ref.pk, seq, run) == "fired":
                    fired += 1
            except CorruptDocument as exc:
                self.engine.driver.fail_corrupt(ref.pk, exc)
            except Exception:
                log.exception("firing clock %s/%s failed", ref.pk, ref.id)
        return fired

    def next_clock(self) -> float | None:
        """Earliest pending fire time known to the store (used by the time-skipping env)."""
        refs = self.engine.store.scan_due(DUE_CLOCK, float("inf"), 1)
        return refs[0].due_at if refs else None

    def _clear_due(self, marker: Doc) -> None:
        if marker.get("due_kind"):
            try:
                self.engine.store.replace(settled(marker), marker["_etag"])
            except ConflictError:
                pass

    # --- signals --------------------------------------------------------------------------

    def signal(
        self,
        execution_id: str,
        name: str,
        value: Any,
        signal_id: str | None = None,
        sender: dict[str, Any] | None = None,
        by: str | None = None,
    ) -> bool:
        """Send signal ``name``; True when the value is recorded, False when it is ignored.
        ``by``: the operator sending it, recorded in the same batch (engine/oplog.py).

        Every value is kept, in arrival order, and each ``wait_signal(name)`` consumes the next
        *valid* one (a channel, like DBOS ``recv`` and Temporal signal handlers). Validation
        happens where the value is consumed (the replay of the wait, against the wait's type): an
        invalid value is recorded as rejected (``sgx:<n>``, type ``signal_rejected``, the
        ``signal_rejected`` event fires) and the wait goes on, so a corrected value still gets
        through. A sender that knows the workflow also validates here (bad value:
        :class:`PayloadValidationError`). Names the workflow does not declare are refused
        (:class:`PayloadValidationError`) by every sender: the exec lists them.

        The value document is created in one batch with a bump of the exec, conditional on the
        exec's etag, so it is either refused or recorded against the state it was checked with
        (never for a run that has just been replaced by continue-as-new). Values are not bound to
        a run: one sent for a name the current run never waits for is carried over to the next
        run (continue-as-new), like Temporal's and DBOS's unconsumed signals. False means the
        execution has ended (the ``signal_ignored`` event fires).

        ``signal_id`` (``wf.signal_external``: derived from the sending step) makes the send
        idempotent: a key document ``sgk:<digest>`` is created in the same batch, and a send
        that finds it recorded returns True and records nothing. Such a value is JSON already
        (validated where it is consumed).
        """
        eng = self.engine
        for _ in range(100):
            eng.read_exec(execution_id)  # a clear UnknownWorkflowError for a wrong id
            docs = eng.cache.load(execution_id)  # one consistent snapshot, exec etag included
            ex = check_exec(execution_id, docs.get(EXEC_ID))
            if ex is None:
                raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
            wf = eng.registry.workflow(str(ex["workflow"]))
            names = declared_signals(ex, wf)
            if names is not None and name not in names:
                raise PayloadValidationError(
                    f"workflow {ex['workflow']!r} declares no signal {name!r} (declared: {', '.join(names)})"
                )
            key = signal_key_id(signal_id) if signal_id is not None else None
            if key is not None and key in docs:
                return True  # this very send was recorded before (a retried send)
            declared = wf.signals.get(name, Any) if wf is not None and name in wf.signals else None
            codec = ValueCodec(Any if declared is None or signal_id is not None else declared)
            data = codec.encode(value, f"signal {name!r}")
            if ex.get("status") in TERMINAL:
                return self._ignored(execution_id, name, str(ex["status"]))
            run = int(ex.get("run") or 0)
            n = int(ex.get("signal_seq") or 0) + 1
            now = eng.clock.now()
            doc: Doc = {
                "pk": execution_id,
                "id": signal_value_id(n),
                "type": "signal_value",
                "name": name,
                "n": n,
                "run": run,
                "value": data,
                "sent_at": now,
            }
            bumped = strip_reserved(ex) | {"signal_seq": n, "wakeups": int(ex.get("wakeups") or 0) + 1}
            if not ex.get("due_kind"):  # a lost drive message is recovered
                bumped.update(due_kind=DUE_EXEC, due_at=now + eng.settings.drive_timeout)
            record = [] if by is None else [signal_op(ex, docs, bumped, by, name, now)]
            ops = [Op.create(doc), *record, Op.replace(bumped, if_match=ex["_etag"])]
            if key is not None:
                doc.update(signal_id=signal_id, sender=sender)
                ops.insert(
                    0, Op.create({"pk": execution_id, "id": key, "type": DocType.SIGNAL_KEY, "value_id": doc["id"]})
                )
            try:
                eng.store.batch(execution_id, ops)
            except ConflictError:
                continue  # the execution moved on (a drive, continue-as-new, another sender): look again
            eng.emit("signal_received", execution_id=execution_id, name=name)
            eng.dispatcher.send_drive(execution_id)
            return True
        raise DurableError(f"could not record signal {name!r} for {execution_id!r}: too much contention")

    def send_signal(self, req: SignalRequest) -> None:
        """Carry out a committed ``wf.signal_external`` step (see :func:`.sends.send_signal`)."""
        send_signal(self.engine, self.signal, req)

    def _ignored(self, execution_id: str, name: str, reason: str) -> bool:
        log.warning("signal %r to %s ignored: %s", name, execution_id, reason)
        self.engine.emit("signal_ignored", execution_id=execution_id, name=name, reason=reason)
        return False

    def after_commit(self, execution_id: str, new_docs: list[Doc]) -> None:
        """Events for signal values a committed replay rejected or ignored (once: create-only)."""
        for doc in new_docs:
            if doc.get("type") == "signal_rejected":
                reason = str((doc.get("error") or {}).get("message", ""))
                log.warning("signal %r to %s rejected: %s", doc["name"], execution_id, reason)
                self.engine.emit("signal_rejected", execution_id=execution_id, name=doc["name"], reason=reason)
            elif doc.get("type") == "signal_ignored":
                self._ignored(execution_id, str(doc["name"]), str(doc.get("reason", "superseded")))

    def wake(self, execution_id: str) -> None:
        """Make sure a drive happens after now: bump the exec (so a running drive re-reads),
        keep it due (so a lost message is recovered), and send a drive."""
        eng = self.engine
        for _ in range(100):
            ex = check_exec(execution_id, eng.store.read(execution_id, EXEC_ID))
            if ex is None or ex.get("status") in TERMINAL:
                return
            bumped = strip_reserved(ex) | {"wakeups": int(ex.get("wakeups") or 0) + 1}
            if not ex.get("due_kind"):
                bumped.update(due_kind=DUE_EXEC, due_at=eng.clock.now() + eng.settings.drive_timeout)
            try:
                eng.store.replace(bumped, if_match=ex["_etag"])
                break
            except ConflictError:
                continue
        eng.dispatcher.send_drive(execution_id)

    # --- children -------------------------------------------------------------------------

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
        if not eng.create_execution(req.workflow, req.payload, req.child_id, parent):
            existing = eng.store.read(req.child_id, EXEC_ID)
            if existing is not None and not is_child_of(existing, req.parent_id, req.run, req.seq):
                if joinable(existing, req):
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

    def _refuse_taken(self, req: ChildRequest, holder: Doc) -> None:
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

    def _join(self, req: ChildRequest, child: Doc) -> bool:
        """Give step ``req`` the outcome of ``child``, this parent's (joinable) child of another step.

        A finished child's outcome is recorded for the step at once. A running child gets the step
        added to its ``joiners`` (etag-guarded, so the write that ends the child, conditional on
        the exec's etag too, either sees it or conflicts and re-reads): :meth:`notify_parent`
        tells every joiner. False when contention or a change of holder left it undone (recovery's
        :meth:`check_child` looks again).
        """
        eng = self.engine
        me = {"pk": req.parent_id, "run": req.run, "seq": req.seq}
        current: Doc | None = child
        for _ in range(20):
            if current is None:
                return False  # gone (purged) meanwhile: recovery starts it again
            if not joinable(current, req):
                self._refuse_taken(req, current)
                return False
            if current.get("status") in TERMINAL:
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
        child = self.engine.store.read(child_id, EXEC_ID)
        pk, run, seq = link
        if child is None or not (is_child_of(child, *link) or {"pk": pk, "run": run, "seq": seq} in joiners_of(child)):
            return
        parent = self.engine.store.read(pk, EXEC_ID) or {}
        if not parent.get("cancel_requested") or int(parent.get("run") or 0) != run:
            # the parent's cancel was withdrawn since (an operator's resume or reset reopened it,
            # and waits for this child again) or its run moved on: a late cancel must not fail it
            log.info("cancel of child %s not sent on: %s no longer cancels run %d", child_id, pk, run)
            return
        try:
            self.engine.cancel(child_id, from_parent=True)
        except UnknownWorkflowError:
            pass

    def _revive(self, fence: Doc) -> bool:
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

    def fence_children(self, parent: Doc, markers: list[Doc]) -> None:
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
                {"pk": parent["pk"], "seq": int(marker["seq"]), "run": int(parent.get("run") or 0)},
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
            eng.store.create(fence)

    def _child_unwanted(self, req: ChildRequest, fenced: bool = False) -> str | None:
        """Why the parent no longer waits for this child (None: it does). A ``fenced`` child
        (its id claimed by a cancel) is wanted again only once the cancel was withdrawn."""
        docs = self.engine.cache.load(req.parent_id)
        ex = check_exec(req.parent_id, docs.get(EXEC_ID))
        if ex is None:
            return "the parent does not exist"
        if ex.get("status") in TERMINAL:
            return f"the parent is {ex['status']}"
        if fenced and ex.get("cancel_requested"):
            return "the parent is being cancelled"
        if int(ex.get("run") or 0) != req.run:
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
        if child is None or child.get("status") not in TERMINAL or not child.get("parent") or is_fence(child):
            return
        now = eng.clock.now()
        docs = [child_outcome(child_id, child, link, now) for link in [child["parent"], *joiners_of(child)]]
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
                child = eng.store.read(child_id, EXEC_ID)
                if child is None or child.get("parent_notified"):
                    return

    def check_child(self, parent_id: str, marker: Doc) -> None:
        """Recovery for a child step still pending after its deadline: start it if it never
        was (and the parent still waits for it), tell the parent if it finished, otherwise look
        again later. A step the parent no longer waits for leaves the scan."""
        eng = self.engine
        check_doc(parent_id, marker)
        if marker.get("kind") == "signal_send":
            send_signal_again(eng, self.signal, parent_id, marker)
            return
        child_id = str(marker["child_id"])
        run, seq = parse_step_id(marker["id"])
        req = ChildRequest(parent_id, seq, str(marker["name"]), dict(marker.get("input") or {}), child_id, run)
        child = check_exec(child_id, eng.store.read(child_id, EXEC_ID))
        if child is not None and not is_child_of(child, parent_id, run, seq):
            # the id is held by another execution: joined if it is this parent's same child,
            # else the step fails (never cancelled); a join left undone stays due
            if self._child_unwanted(req) is None:
                if not joinable(child, req):
                    self._refuse_taken(req, child)
                elif not self._join(req, child):
                    return
            self._clear_due(marker)
            return
        if child is not None and is_fence(child) and self._child_unwanted(req, fenced=True) is None:
            child = None  # the parent waits for it again (resumed by an operator): start it
        if child is not None and child.get("status") in TERMINAL:
            if is_fence(child):
                self.wake(parent_id)  # never a real outcome: the parent's cancel drive records the step's
            else:
                self.notify_parent(child_id)
                if eng.store.read(parent_id, result_id(seq, run)) is None:
                    # not taken: a cancelled end of a cancel the parent withdrew, whose child could
                    # not be resumed yet (a step of it still running): ask again later
                    self._push_due(marker)
                    return
            self._clear_due(marker)
            return
        why = self._child_unwanted(req)
        if why is not None:
            parent = eng.store.read(parent_id, EXEC_ID) or {}
            outcome = eng.store.read(parent_id, result_id(seq, run)) or {}
            if child is not None and (parent.get("status") == CANCELLED or outcome.get("cancelled")):
                eng.cancel(child_id, from_parent=True)  # the parent's cancel message to it was lost
            self._clear_due(marker)
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

    def prune_run(self, execution_id: str, old_run: int) -> None:
        """After continue-as-new, delete the previous run's step documents and the signal
        values it settled (best effort). Unsettled values stay: the new run consumes them.

        Each batch of deletes bumps the exec's ``generation``: a partition cache cannot see a
        deletion, and one holding a value without its (deleted) mark would consume it again.
        """
        eng = self.engine
        prefixes = run_prefixes(old_run)
        try:
            doomed: list[str] = []
            for doc in eng.store.query_partition(execution_id).docs:
                if doc.get("due_kind") == DUE_ADMIT:
                    continue  # an emitted effect not admitted yet: beat's outbox scan still needs it
                if doc["id"].startswith(prefixes):
                    doomed.append(doc["id"])
                elif doc["id"].startswith(SIGNAL_MARK_PREFIX) and doc.get("run") == old_run:
                    doomed += [str(doc["value_id"]), doc["id"]]  # the value first
            while doomed:
                chunk, rest = doomed[: eng.store.max_batch_ops - 1], doomed[eng.store.max_batch_ops - 1 :]
                ex = eng.store.read(execution_id, EXEC_ID)
                if ex is None:
                    return
                ops = [Op.replace(bump_generation(ex), if_match=ex["_etag"])] + [Op.delete(i) for i in chunk]
                try:
                    eng.store.batch(execution_id, ops)
                except ConflictError:
                    # the exec moved on (or a document is already gone): look again
                    present = {d["id"] for d in eng.store.query_partition(execution_id).docs}
                    doomed = [i for i in doomed if i in present]
                    continue
                doomed = rest
        except Exception:  # leftovers are harmless: ids of an old run are never read again
            log.warning("pruning run %d of %s failed", old_run, execution_id, exc_info=True)
