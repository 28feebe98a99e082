"""Recovery scans run by beat (docs/architecture.md): cost grows with what is due, not with history.

* ``exec`` due — an execution that needed a drive and got none (lost message, dead driver,
  lapsed exec lease, workflow unknown here until a deploy): send a drive.
* ``activity`` due — an activity whose message was never picked up, or whose attempt lease
  lapsed without a result (killed worker): send it again. The first-writer-wins result makes
  a duplicate harmless. After ``max_lost_attempts`` lost attempts the step fails.
* ``chunk`` due — chunk documents of a large document an hour old: deleted unless the document
  names them (a writer died between its chunks and its commit): ``stores/offload/chunk_gc.py``.

Each found document is pushed forward with an etag replace before anything is sent, so two
beats by mistake send at most one message per item and interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.delivery import request_of
from celery_durable.engine.admin.pause import park
from celery_durable.engine.admin.pending_ops import PENDING, finish
from celery_durable.engine.documents.checks import MalformedDocument, check_exec, check_partition, check_shape
from celery_durable.engine.documents.model import (
    DUE_ACTIVITY,
    DUE_CHILD,
    DUE_EXEC,
    EXEC_ID,
    error_info,
    lease_live,
    marker_id,
    parse_step_id,
    result_id,
    run_of,
    settled,
)
from celery_durable.engine.documents.records import count_of, is_terminal
from celery_durable.engine.drive.upkeep import clear_due_of_ended
from celery_durable.errors import ConflictError, CorruptDocument
from celery_durable.stores.base import DueRef, find_inner, strip_reserved
from celery_durable.stores.offload.chunk_gc import collect_chunks
from celery_durable.stores.offload.store import Offloading

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["Recovery", "ScanReport"]

log = logging.getLogger("celery_durable.recovery")

#: consecutive re-sends of a step no attempt started are at most this many queue timeouts apart
MAX_RESEND_SPACING = 8


@dataclass
class ScanReport:
    redriven: int = 0
    resent: int = 0
    failed: int = 0
    cleared: int = 0
    errors: int = 0
    #: waiting steps sent a limit slot that had lapsed or was not handed on
    granted: int = 0
    #: large documents' versions whose orphan chunks were deleted
    chunks_collected: int = 0


class Recovery:
    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def scan(self, limit: int = 500) -> ScanReport:
        """One pass over everything due. One bad execution never stops it: a malformed document
        fails its own execution (``Driver.fail_corrupt``), any other error is counted and logged."""
        report = ScanReport()
        now = self.engine.clock.now()
        for ref in self.engine.store.scan_due(DUE_EXEC, now, limit):
            self._guard(report, ref, self._exec_due, ref.pk, now, report)
        for ref in self.engine.store.scan_due(DUE_ACTIVITY, now, limit):
            self._guard(report, ref, self._activity_due, ref.pk, ref.id, now, report)
        for ref in self.engine.store.scan_due(DUE_CHILD, now, limit):
            self._guard(report, ref, self._child_due, ref.pk, ref.id)
        try:
            report.granted += self.engine.limits.scan(limit)  # slots nobody handed on (engine/limits/)
        except Exception as exc:  # the other scans go on
            report.errors += 1
            log.exception("limit scan failed: %s", exc)
        offloading = find_inner(self.engine.store, lambda s: isinstance(s, Offloading))
        if offloading is not None:
            chunks = collect_chunks(offloading, now, limit)
            report.chunks_collected += chunks.collected
            report.errors += chunks.errors
        return report

    def _child_due(self, pk: str, marker_id_: str) -> None:
        marker = self.engine.store.read(pk, marker_id_)
        if marker is not None and marker.get("due_kind") == DUE_CHILD:
            self.engine.children.check_child(pk, check_shape(pk, marker))

    def _guard(self, report: ScanReport, ref: DueRef, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except CorruptDocument as exc:
            report.errors += 1
            self.engine.driver.fail_corrupt(ref.pk, exc)
        except Exception as exc:  # a store outage, a conflict storm, a foreign document: go on
            report.errors += 1
            log.exception("recovery of %s/%s failed: %s", ref.pk, ref.id, exc)

    def _exec_due(self, pk: str, now: float, report: ScanReport) -> None:
        eng = self.engine
        ex = check_exec(pk, eng.store.read(pk, EXEC_ID))
        if ex is None or finish(eng, pk, ex):  # an operator's op left half done: finished, it drives
            return
        if is_terminal(ex) and ex.get("parent") and not ex.get("parent_notified"):
            eng.children.notify_parent(pk)  # the child finished but its parent was never told
            report.redriven += 1
            return
        if is_terminal(ex) or lease_live(ex, now):
            if is_terminal(ex):
                try:
                    eng.store.replace(settled(ex), if_match=ex["_etag"])
                    report.cleared += 1
                except ConflictError:
                    pass
            return
        pushed = strip_reserved(ex) | {"due_at": now + eng.settings.drive_timeout, "lease": None}
        try:
            eng.store.replace(pushed, if_match=ex["_etag"])
        except ConflictError:
            return  # someone is on it (another beat, or a drive)
        eng.emit("recovery_redrive", execution_id=pk)
        eng.dispatcher.send_drive(pk)
        report.redriven += 1

    def _activity_due(self, pk: str, doc_id: str, now: float, report: ScanReport) -> None:
        eng = self.engine
        run, seq = parse_step_id(doc_id)
        docs = eng.cache.load(pk)
        check_partition(pk, docs)
        marker = docs.get(marker_id(seq, run))
        ex = docs.get(EXEC_ID)
        if marker is None or (ex is not None and isinstance(ex.get(PENDING), dict)):
            return  # an operation re-arming it is half done: its exec is finished first (due too)
        done = result_id(seq, run) in docs or ex is None or is_terminal(ex) or run_of(ex) != run
        if not done and marker.get("kind") != "activity":
            raise MalformedDocument(pk, marker_id(seq, run), f"a {marker.get('kind')} step is due as an activity")
        if done and ex is not None and is_terminal(ex) and run_of(ex) == run and result_id(seq, run) not in docs:
            # on the exec as read: an execution reopened since keeps its step due (reopen.py)
            report.cleared += clear_due_of_ended(eng, marker, ex)
            return
        if done:
            try:
                eng.store.replace(settled(marker), marker["_etag"])
                report.cleared += 1
            except ConflictError:
                pass
            return
        if lease_live(marker, now):
            return
        if ex is not None and ex.get("paused"):  # re-sent once unpaused (engine/admin/pause.py)
            park(eng, marker, ex)
            return
        lost = count_of(marker, "lost") + (1 if marker.get("lease") else 0)
        if lost > eng.settings.max_lost_attempts:
            err = RuntimeError(f"activity {marker['name']!r} was lost {lost} times (worker killed?)")
            result = {
                "pk": pk,
                "id": result_id(seq, run),
                "type": "result",
                "run": run,
                "seq": seq,
                "name": marker["name"],
                "ok": False,
                "error": error_info(err, attempts=count_of(marker, "attempts")),
                "attempts": count_of(marker, "attempts"),
                "completed_at": now,
            }
            eng.driver.drive(pk, carry=[result], release=[seq])
            report.failed += 1
            return
        # Re-sent while no attempt started since the last re-send: the message is more likely
        # queued behind a backlog than lost, and each copy lengthens that backlog. Space such
        # re-sends out (1, 2, 4, then 8 queue timeouts); after a started attempt, one timeout.
        # "Nothing since" is the due time this scan set still being there (``resent_due``):
        # whoever else rewrites it (an attempt's start, a retry, a reset/resume sending afresh)
        # breaks the chain. Never by clocks: started_at is a worker's, resent_at a beat's.
        chained = marker.get("resent_due") is not None and marker.get("resent_due") == marker.get("due_at")
        queued = count_of(marker, "resends") + 1 if chained else 1
        due_at = now + eng.settings.activity_queue_timeout * min(2 ** (queued - 1), MAX_RESEND_SPACING)
        pushed = strip_reserved(marker) | {
            "lease": None,
            "lost": lost,
            "resends": queued,
            "resent_at": now,
            "resent_due": due_at,
            "due_at": due_at,
        }
        try:
            eng.store.replace(pushed, if_match=marker["_etag"])
        except ConflictError:
            return
        eng.emit("recovery_resend", execution_id=pk, seq=seq, activity=marker["name"])
        eng.dispatcher.send_activity(request_of(pk, marker, ex))
        report.resent += 1
