"""Durable timers: firing a due clock (a sleep, a signal wait's timeout, a local activity's retry,
an execution's deadline or delayed start: engine/starts/deadlines.py).

A clock fires by *creating* its outcome document, create-only, and then driving the execution with
it (the driver's carry). Several writers (the fast-path countdown, beat's clock scan, two beats by
mistake) therefore converge on one outcome: the first writer wins and the others find it recorded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery_durable.engine.documents.checks import (
    check_partition,
)
from celery_durable.engine.documents.model import (
    DUE_CLOCK,
    EXEC_ID,
    marker_id,
    parse_step_id,
    result_id,
    run_of,
)
from celery_durable.engine.documents.schema import signal_outcome_id
from celery_durable.errors import (
    CorruptDocument,
)
from celery_durable.stores.base import Doc

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts
from celery_durable.engine.admin.pause import park
from celery_durable.engine.documents.records import ExecDoc, count_of, is_terminal, maybe_exec
from celery_durable.engine.drive.upkeep import clear_due, clear_due_of_ended
from celery_durable.engine.outcomes import ClockOutcome
from celery_durable.engine.starts.deadlines import CLOCK_PREFIX, DEADLINE_CLOCK, fire_exec_clock

__all__ = ["Timers"]

log = logging.getLogger("celery_durable.links")


class Timers:
    """Fire due clocks: the fast path's countdown and beat's scan (``celery_durable.fire_due_clocks``)."""

    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def fire_clock(self, execution_id: str, seq: int, run: int = 0) -> ClockOutcome:
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
        ex = maybe_exec(docs.get(EXEC_ID))
        marker = docs.get(marker_id(seq, run))
        if ex is None or marker is None:
            return ClockOutcome.MISSING
        kind = marker.get("kind")
        if kind == "activity" and marker.get("local") and marker.get("fire_at") is not None:
            return self._fire_local_retry(ex, marker, docs, seq, run)
        if kind not in ("sleep", "signal") or marker.get("fire_at") is None:
            return ClockOutcome.MISSING
        done = result_id(seq, run) in docs or (kind == "signal" and signal_outcome_id(marker, run) in docs)
        if is_terminal(ex) and not done and run_of(ex) == run:
            clear_due_of_ended(self.engine, marker, ex)  # unless reopened since (engine/admin/reopen.py)
            return ClockOutcome.DONE
        if is_terminal(ex) or done or run_of(ex) != run:
            clear_due(self.engine, marker)
            return ClockOutcome.DONE
        now = eng.clock.now()
        fire_at = float(marker.get("fire_at") or 0.0)
        if now < fire_at:
            return ClockOutcome.EARLY
        doc: Doc = {"pk": execution_id, "id": result_id(seq, run), "type": "result", "run": run, "seq": seq}
        if kind == "signal":
            signals_seen = count_of(ex, "signal_seq")
            doc.update(name=marker["name"], ok=False, timeout=True, signals_seen=signals_seen, fired_at=now)
        else:
            doc.update(ok=True, value=None, fired_at=now)
        eng.emit("timer_fired", execution_id=execution_id, seq=seq, lateness=now - fire_at)
        eng.driver.drive(execution_id, carry=[doc], release=[seq])
        return ClockOutcome.FIRED

    def _fire_local_retry(
        self, ex: ExecDoc | None, marker: Doc, docs: dict[str, Doc], seq: int, run: int
    ) -> ClockOutcome:
        """A local activity's retry timer (a backoff too long to wait in the drive): drive, and
        the drive runs the next attempt in its process (``engine/activities/local_activities.py``)."""
        if ex is None or is_terminal(ex) or result_id(seq, run) in docs or run_of(ex) != run:
            clear_due(self.engine, marker)
            return ClockOutcome.DONE
        if self.engine.clock.now() < float(marker["fire_at"]):
            return ClockOutcome.EARLY
        if ex.get("paused"):  # runs once unpaused (engine/admin/pause.py)
            park(self.engine, marker, ex)
            return ClockOutcome.DONE
        self.engine.driver.drive(str(ex["pk"]))
        return ClockOutcome.FIRED

    def fire_deadline(self, execution_id: str) -> ClockOutcome:
        """Fire the execution's deadline clock now (an unpause past it: engine/admin/pause.py)."""
        return fire_exec_clock(self.engine, execution_id, DEADLINE_CLOCK)

    def fire_due_clocks(self, limit: int = 500) -> int:
        """Beat's clock scan: fire everything due (including clocks whose fast path was lost).

        One bad execution never stops the scan: a malformed document fails its own execution.
        """
        fired = 0
        for ref in self.engine.store.scan_due(DUE_CLOCK, self.engine.clock.now(), limit):
            try:
                if ref.id.startswith(CLOCK_PREFIX):  # an execution's deadline or delayed start
                    outcome = fire_exec_clock(self.engine, ref.pk, ref.id)
                else:
                    run, seq = parse_step_id(ref.id)
                    outcome = self.fire_clock(ref.pk, seq, run)
                if outcome == ClockOutcome.FIRED:
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
