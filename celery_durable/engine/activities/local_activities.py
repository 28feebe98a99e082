"""Local activities: steps the drive runs in its own process (docs/architecture.md §6).

``@durable_activity(local=True)`` marks an activity whose steps need no broker round trip: a
replay that reaches one records a ``local`` marker and sends nothing; the driver runs the
function right there, puts the marker and its outcome into the history it holds, replays again,
and so on until the workflow suspends on something else or ends, then commits every marker and
outcome with the exec in its one batch. Three trivial local steps cost one drive: one partition
read and one commit.

Retries follow the activity's own Celery options (``autoretry_for``, ``max_retries``,
``default_retry_delay``, ``retry_backoff``…, as :class:`..retry.TaskRetry`): a backoff up to
:data:`INLINE_RETRY_MAX` seconds (and :data:`INLINE_BUDGET` in all, per drive) is waited in the
drive; a longer one commits the marker with its attempts, ``last_error`` and a retry timer
(``fire_at``, due ``clock``), and the drive that timer starts runs the next attempt.

Crash semantics (at least once, as for any activity): nothing is written before the function
runs, so a drive that dies between running it and its commit leaves no trace, and the next drive
(recovery re-drives the execution, due since its last commit) runs it again; a lost commit is
exactly a remote attempt whose worker died before recording its result. Such re-runs are not
counted in ``attempts`` (no write precedes them): keep local activities short and idempotent,
and use a normal activity for work that must be counted or leased.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.attempts import run_awaitable
from celery_durable.engine.dispatcher import ClockRequest
from celery_durable.engine.documents.model import DUE_CLOCK, error_info, marker_id, result_id, run_of
from celery_durable.engine.documents.records import ExecDoc, count_of
from celery_durable.engine.outcomes import ReplayKind
from celery_durable.engine.replay.context import LocalStep
from celery_durable.errors import NonRetryableError
from celery_durable.retry import TaskRetry
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts
    from celery_durable.engine.replay.history import Replay

__all__ = ["LocalRun", "INLINE_RETRY_MAX", "INLINE_BUDGET", "policy_of"]

log = logging.getLogger("celery_durable.local")

#: a retry backoff up to this many seconds is waited in the drive; a longer one becomes a timer
INLINE_RETRY_MAX = 1.0
#: seconds one drive may spend waiting for local retries in all
INLINE_BUDGET = 2.0
#: local steps one drive runs at most before it commits (and drives again)
MAX_LOCAL_STEPS = 1000


def policy_of(options: dict[str, Any]) -> TaskRetry:
    """The retry options of a local activity (``options["local"]``: a TaskRetry, or True)."""
    local = options.get("local")
    return local if isinstance(local, TaskRetry) else TaskRetry()


@dataclass
class LocalRun:
    """What one drive's local steps produced, kept across its conflict rounds (never run twice)."""

    #: markers and outcomes to create, by id
    created: dict[str, Doc] = field(default_factory=dict)
    #: committed markers rewritten with a retry timer (etag-guarded), by id
    replaced: dict[str, Doc] = field(default_factory=dict)
    #: committed markers whose outcome we record (settled in the commit)
    release: list[int] = field(default_factory=list)
    sends: list[ClockRequest] = field(default_factory=list)
    slept: float = 0.0
    ran: int = 0

    def history_for(self, docs: dict[str, Doc]) -> dict[str, Doc]:
        """Our documents the partition as read does not hold (a racing drive's win over ours)."""
        for doc_id, doc in list(self.replaced.items()):
            if docs.get(doc_id, {}).get("_etag") != doc.get("_etag"):
                del self.replaced[doc_id]  # the marker moved on: its attempt is decided afresh
        return {i: d for i, d in self.created.items() if i not in docs} | {
            i: strip_reserved(d) for i, d in self.replaced.items()
        }


class LocalRunner:
    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def drive_locals(
        self,
        ex: ExecDoc,
        docs: dict[str, Doc],
        history: dict[str, Doc],
        replay: Replay,
        run: LocalRun,
        again: Callable[[], Replay],
    ) -> Replay:
        """Run the local steps ``replay`` waits for, replaying (``again``) after each batch,
        until it waits for nothing local that can run now; return the last replay."""
        while replay.kind == ReplayKind.SUSPENDED and replay.local and run.ran < MAX_LOCAL_STEPS:
            progressed = False
            for step in replay.local:
                if self._run_step(ex, docs, history, step, run):
                    progressed = True
            if not progressed:
                break
            replay = again()
        if replay.kind == ReplayKind.SUSPENDED:
            self._park(ex, history, replay, run)
        replay.sends.extend(run.sends)
        return replay

    def _park(self, ex: ExecDoc, history: dict[str, Doc], replay: Replay, run: LocalRun) -> None:
        """A new local marker left without an outcome (too many steps in one drive) gets a timer
        due now, so a drive runs it: never a step nothing will run."""
        now = self.engine.clock.now()
        rn = run_of(ex)
        for step in replay.local:
            marker = next((d for d in replay.new_docs if d["id"] == step.marker["id"]), None)
            if marker is not None and marker.get("fire_at") is None:
                marker.update(fire_at=now, due_kind=DUE_CLOCK, due_at=now)
                run.sends.append(ClockRequest(str(ex["pk"]), step.seq, now, rn))

    def _run_step(
        self, ex: ExecDoc, docs: dict[str, Doc], history: dict[str, Doc], step: LocalStep, run: LocalRun
    ) -> bool:
        """Run one local step's attempts; True when its outcome (or retry timer) is now in ``history``."""
        eng = self.engine
        rn = run_of(ex)
        mid = marker_id(step.seq, rn)
        committed = docs.get(mid)
        now = eng.clock.now()
        if float(step.marker.get("fire_at") or 0.0) > now:
            return False  # waits for its retry timer (set by this drive or committed before)
        marker = strip_reserved(step.marker)
        attempt = count_of(marker, "attempts")
        act = eng.registry.activity(step.name)
        policy = policy_of(act.options) if act is not None else TaskRetry()
        while True:
            attempt += 1
            run.ran += 1
            try:
                if act is None:
                    raise NonRetryableError(f"activity {step.name!r} is not registered here")
                payload = marker.get("input") or {}
                args, kwargs = act.codec.decode_args(
                    {"args": payload.get("args", []), "kwargs": payload.get("kwargs", {})}
                )
                value = act.codec.encode_result(run_awaitable(act.fn(*args, **kwargs)))
            except Exception as exc:
                delay = policy.next_delay(attempt - 1, exc)
                if delay is not None and delay <= INLINE_RETRY_MAX and run.slept + delay <= INLINE_BUDGET:
                    self._wait(delay)
                    run.slept += delay
                    continue
                if delay is not None:  # a longer backoff: commit the attempts, retry on a timer
                    fire_at = eng.clock.now() + delay
                    marker.update(attempts=attempt, last_error=error_info(exc, attempts=attempt))
                    marker.update(failed_at=eng.clock.now(), retry_at=fire_at)
                    marker.update(fire_at=fire_at, due_kind=DUE_CLOCK, due_at=fire_at)
                    self._keep_marker(marker, committed, run)
                    history[mid] = dict(marker)
                    run.sends.append(ClockRequest(str(ex["pk"]), step.seq, fire_at, rn))
                    return True
                outcome: dict[str, Any] = {"ok": False, "error": error_info(exc, attempts=attempt)}
            else:
                outcome = {"ok": True, "value": value}
            break
        eng.emit(
            "activity_completed" if outcome["ok"] else "activity_failed",
            execution_id=ex["pk"],
            seq=step.seq,
            activity=step.name,
            attempts=attempt,
        )
        result: Doc = {
            "pk": ex["pk"],
            "id": result_id(step.seq, rn),
            "type": "result",
            "run": rn,
            "seq": step.seq,
            "name": step.name,
            "attempts": attempt,
            "local": True,
            "completed_at": eng.clock.now(),
        } | outcome
        if committed is None:
            marker.update(attempts=attempt, started_at=now)
            run.created[mid] = marker
            history[mid] = marker
        else:
            run.replaced.pop(mid, None)
            run.release.append(step.seq)
        run.created[result["id"]] = result
        history[result["id"]] = result
        return True

    @staticmethod
    def _keep_marker(marker: Doc, committed: Doc | None, run: LocalRun) -> None:
        mid = str(marker["id"])
        if committed is None:
            run.created[mid] = dict(marker)
        else:
            run.replaced[mid] = marker | {"_etag": committed["_etag"]}

    def _wait(self, seconds: float) -> None:
        """Wait a short backoff: on a fake clock (``WorkflowEnvironment``) by moving it."""
        advance = getattr(self.engine.clock, "advance", None)
        if callable(advance):
            advance(seconds)
        else:
            time.sleep(seconds)
