"""Timers, signals and child workflows: the engine operations behind DESIGN.md §7.

All three complete a step by *creating* its outcome document, create-only, and then driving
the execution with it (the driver's carry). Several writers — the fast-path countdown, beat's
clock scan (two beats by mistake), a signal racing its timeout — therefore converge on one
outcome: the first writer wins and the others find it recorded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..codecs import ValueCodec
from ..errors import ConflictError
from ..stores.base import Doc, strip_reserved
from .dispatcher import ChildRequest
from .model import (
    CANCELLED,
    COMPLETED,
    DUE_CLOCK,
    DUE_EXEC,
    EXEC_ID,
    TERMINAL,
    marker_id,
    parse_step_id,
    result_id,
    settled,
    signal_id,
)

if TYPE_CHECKING:
    from .core import Engine

__all__ = ["Links"]

log = logging.getLogger("celery_durable.links")


class Links:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- timers ---------------------------------------------------------------------------

    def fire_clock(self, execution_id: str, seq: int, run: int = 0) -> str:
        """Fire a due timer (a sleep, or a signal wait's timeout). Idempotent."""
        eng = self.engine
        docs = eng.cache.load(execution_id)
        ex = docs.get(EXEC_ID)
        marker = docs.get(marker_id(seq, run))
        if ex is None or marker is None:
            return "missing"
        kind = marker.get("kind")
        outcome_id = signal_id(str(marker["name"]), run) if kind == "signal" else result_id(seq, run)
        if ex.get("status") in TERMINAL or outcome_id in docs or int(ex.get("run") or 0) != run:
            self._clear_due(marker)
            return "done"
        now = eng.clock.now()
        fire_at = float(marker.get("fire_at") or 0.0)
        if now < fire_at:
            return "early"
        doc: Doc = {"pk": execution_id, "id": outcome_id, "run": run, "seq": seq, "fired_at": now}
        if kind == "signal":
            doc.update(type="signal", name=marker["name"], ok=False, timeout=True)
        else:
            doc.update(type="result", ok=True, value=None)
        eng.emit("timer_fired", execution_id=execution_id, seq=seq, lateness=now - fire_at)
        eng.driver.drive(execution_id, carry=[doc], release=[seq])
        return "fired"

    def fire_due_clocks(self, limit: int = 500) -> int:
        """Beat's clock scan: fire everything due (including clocks whose fast path was lost)."""
        fired = 0
        for ref in self.engine.store.scan_due(DUE_CLOCK, self.engine.clock.now(), limit):
            run, seq = parse_step_id(ref.id)
            try:
                if self.fire_clock(ref.pk, seq, run) == "fired":
                    fired += 1
            except Exception:  # one bad execution must not stop the scan for the others
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

    def signal(self, execution_id: str, name: str, value: Any) -> bool:
        """Deliver signal ``name``; False when a value (or its timeout) was already recorded.

        The value is validated against the workflow's declared signal type here, in the
        sender; a bad value raises and the workflow is untouched.
        """
        eng = self.engine
        ex = eng.read_exec(execution_id)
        wf = eng.registry.workflow(str(ex.get("workflow")))
        declared = (wf.signals if wf is not None else {}).get(name, Any)
        data = ValueCodec(declared).encode(value, f"signal {name!r}")
        if ex.get("status") in TERMINAL:
            log.warning("signal %r to %s ignored: the execution is %s", name, execution_id, ex["status"])
            eng.emit("signal_ignored", execution_id=execution_id, name=name, reason=str(ex["status"]))
            return False
        run = int(ex.get("run") or 0)
        doc: Doc = {
            "pk": execution_id,
            "id": signal_id(name, run),
            "type": "signal",
            "run": run,
            "name": name,
            "ok": True,
            "value": data,
            "sent_at": eng.clock.now(),
        }
        if eng.store.create(doc) is None:
            log.warning("signal %r to %s ignored: a value was already recorded (first wins)", name, execution_id)
            eng.emit("signal_ignored", execution_id=execution_id, name=name, reason="already recorded")
            return False
        eng.emit("signal_received", execution_id=execution_id, name=name)
        self.wake(execution_id)
        return True

    def wake(self, execution_id: str) -> None:
        """Make sure a drive happens after now: bump the exec (so a running drive re-reads),
        keep it due (so a lost message is recovered), and send a drive."""
        eng = self.engine
        for _ in range(100):
            ex = eng.store.read(execution_id, EXEC_ID)
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

    def start_child(self, req: ChildRequest) -> None:
        """Create the child's execution (idempotent by its derived id) and drive it."""
        eng = self.engine
        parent = {"pk": req.parent_id, "seq": req.seq, "run": req.run}
        created = eng.create_execution(req.workflow, req.payload, req.child_id, parent)
        if not created:
            existing = eng.store.read(req.child_id, EXEC_ID)
            if existing is not None and existing.get("parent") != parent:
                log.error("child id %s is taken by an unrelated execution", req.child_id)

    def notify_parent(self, child_id: str) -> None:
        """Record a finished child's outcome in its parent and drive the parent."""
        eng = self.engine
        child = eng.store.read(child_id, EXEC_ID)
        if child is None or child.get("status") not in TERMINAL or not child.get("parent"):
            return
        link = child["parent"]
        seq, run = int(link["seq"]), int(link.get("run") or 0)
        status = child["status"]
        err = child.get("error") or {}
        if status == CANCELLED:
            err = {"type": "WorkflowCancelledError", "message": f"child {child_id!r} was cancelled"}
        doc: Doc = {
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
            "completed_at": eng.clock.now(),
        }
        eng.driver.drive(str(link["pk"]), carry=[doc], release=[seq])
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
        was, tell the parent if it finished, otherwise look again later."""
        eng = self.engine
        child_id = str(marker["child_id"])
        child = eng.store.read(child_id, EXEC_ID)
        if child is None:
            run, seq = parse_step_id(marker["id"])
            self.start_child(
                ChildRequest(parent_id, seq, str(marker["name"]), dict(marker.get("input") or {}), child_id, run)
            )
        elif child.get("status") in TERMINAL:
            self.notify_parent(child_id)
            return
        pushed = strip_reserved(marker) | {"due_at": eng.clock.now() + eng.settings.activity_queue_timeout}
        try:
            eng.store.replace(pushed, if_match=marker["_etag"])
        except ConflictError:
            pass

    def prune_run(self, execution_id: str, old_run: int) -> None:
        """After continue-as-new, delete the previous run's step documents (best effort)."""
        eng = self.engine
        prefixes = (f"s{old_run or ''}:", f"r{old_run or ''}:", f"sig{old_run or ''}:")
        try:
            for doc in eng.store.query_partition(execution_id).docs:
                if doc["id"].startswith(prefixes):
                    eng.store.delete(execution_id, doc["id"])
        except Exception:  # leftovers are harmless: ids of an old run are never read again
            log.warning("pruning run %d of %s failed", old_run, execution_id, exc_info=True)
