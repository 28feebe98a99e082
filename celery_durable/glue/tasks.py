"""The library's own Celery tasks and the Celery implementation of the engine's dispatcher.

Task names are stored in messages and schedules, so they are explicit and stable:
``celery_durable.drive``, ``celery_durable.recover``.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.documents.checks import check_workflow_id
from celery_durable.engine.limits.spec import limit_of_stored
from celery_durable.engine.outbox.model import EffectRef, EffectSender
from celery_durable.engine.outcomes import ClockOutcome, DriveOutcome
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.beat_scans import clock_pass, recovery_pass
from celery_durable.glue.durable_activity import DURABLE_HEADER
from celery_durable.glue.eager_activities import eagerly, give_back, keep, keeps
from celery_durable.glue.session_tokens import retry_stale, session_headers, use_session
from celery_durable.glue.wire import WireTask, serializer

if TYPE_CHECKING:
    from celery_durable.glue.extension import DurableLike

__all__ = [
    "CeleryDispatcher",
    "register_tasks",
    "DRIVE_TASK",
    "RECOVER_TASK",
    "FIRE_CLOCK_TASK",
    "FIRE_DUE_CLOCKS_TASK",
]


DRIVE_TASK = "celery_durable.drive"
RECOVER_TASK = "celery_durable.recover"
FIRE_CLOCK_TASK = "celery_durable.fire_clock"
FIRE_DUE_CLOCKS_TASK = "celery_durable.fire_due_clocks"
START_SCHEDULED_TASK = "celery_durable.start_scheduled"


def tick_id(schedule_name: str, period: float, now: float) -> str:
    """The workflow id of the tick containing ``now``: equal for every beat in that window."""
    tick = math.floor(now / period) * period
    stamp = datetime.fromtimestamp(tick, tz=UTC).strftime("%Y%m%dT%H%M%S")
    return f"{schedule_name}@{stamp}"


class CeleryDispatcher:
    """Sends engine work as Celery messages (the app's serializer, glue/wire.py; deterministic task ids)."""

    def __init__(self, app: Celery, fast_timer_max: float = 60.0, effects: EffectSender | None = None) -> None:
        self.app = app
        self.fast_timer_max = fast_timer_max
        self._effects = effects

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        if self._effects is None:
            raise RuntimeError("this dispatcher was built without an effect sender")
        self._effects.send_effect(ref, countdown)

    def send_activity(self, request: ActivityRequest) -> None:
        if keep(request):  # the delivery that scheduled it runs it next (glue/eager_activities.py)
            return
        if request.holder is not None:
            # its commit took its lease to run it here, and now it cannot be (the worker began to
            # stop in between): give the lease back, or its message is refused until it lapses
            give_back(self.app, request)
        self.publish_activity(request)

    def hand_off(self, request: ActivityRequest) -> bool:
        """Will the current delivery run ``request`` (a slot just freed here was granted to it,
        ``request.handoff``) next? Then it is not sent (engine/limits/grants.py)."""
        return keep(request)

    def keeps(self, request: ActivityRequest) -> bool:
        """Would the current delivery run ``request`` next (``Dispatcher.keeps``)?"""
        return keeps(request)

    def publish_activity(self, request: ActivityRequest) -> None:
        """Send the activity's message (never kept for an eager run)."""
        options = self.activity_options(request)
        task = self.app.tasks.get(request.name)
        kwargs = dict(request.kwargs)
        if task is not None:
            task.apply_async(args=list(request.args), kwargs=kwargs, **options)
        else:  # defined only in the worker's code base: route by name
            self.app.send_task(request.name, args=list(request.args), kwargs=kwargs, **options)

    def activity_options(self, request: ActivityRequest) -> dict[str, Any]:
        """The options of the activity's message (what an eager run's request has too)."""
        return {
            "task_id": request.task_id,
            # the step's identity travels in a header: it survives Celery's retries and keeps
            # the user's kwargs (and Celery's argument checking) untouched
            "headers": {
                DURABLE_HEADER: _step_header(request),
                **session_headers(self.app, request.execution_id),
            },
            # Flower shows this instead of the bare task name
            "shadow": f"{request.name} [{request.workflow} {request.execution_id} #{request.seq}]",
            "serializer": serializer(self.app),
            "ignore_result": True,
        }

    def send_drive(self, execution_id: str, countdown: float | None = None) -> None:
        self.app.send_task(
            DRIVE_TASK,
            args=[execution_id],
            countdown=countdown,
            headers=session_headers(self.app, execution_id),
            shadow=f"drive [{execution_id}]",
            serializer=serializer(self.app),
            ignore_result=True,
        )

    def send_clock(self, request: ClockRequest) -> None:
        # Fast path for short timers only: a broker ETA longer than the visibility timeout
        # would be redelivered or lost; long timers rely on the store and beat's clock scan.
        delay = request.fire_at - time.time()
        if delay > self.fast_timer_max:
            return
        self.app.send_task(
            FIRE_CLOCK_TASK,
            args=[request.execution_id, request.seq, request.run],
            countdown=max(0.0, delay),
            headers=session_headers(self.app, request.execution_id),
            shadow=f"timer [{request.execution_id} #{request.seq}]",
            serializer=serializer(self.app),
            ignore_result=True,
        )


def _step_header(request: ActivityRequest) -> dict[str, Any]:
    """The step's identity; ``t``: the token proving which marker it is for (engine/activities/delivery.py)."""
    meta: dict[str, Any] = {"e": request.execution_id, "s": request.seq, "r": request.run, "w": request.workflow}
    if request.token is not None:  # a legacy marker's message carries none
        meta["t"] = request.token
    return meta


def register_tasks(app: Celery, durable: DurableLike) -> None:
    """Register the internal tasks on ``app`` (idempotent).

    ``shared=False``: Celery shares ``app.task`` tasks with every app created later in the process,
    and a shared drive would run another app's executions with this app's extension and store.
    """
    if DRIVE_TASK in app.tasks:
        return

    @app.task(
        base=WireTask, name=DRIVE_TASK, bind=True, ignore_result=True, max_retries=None, acks_late=False, shared=False
    )
    def drive(self: Any, execution_id: str) -> str:
        engine = durable.engine
        use_session(engine.store, self.request, execution_id)
        try:
            # the first activities it schedules may run here (glue/eager_activities.py)
            outcome = eagerly(self, engine, execution_id, lambda: engine.drive(execution_id))
        except StoreUnavailable as exc:
            # the execution stays due; retrying here just makes recovery faster
            raise self.retry(exc=exc, countdown=min(30.0, 1.0 * 2 ** min(self.request.retries, 5))) from exc
        if outcome == DriveOutcome.MISSING and retry_stale(self, engine.counters, "no such execution"):
            return "missing (retrying)"
        return outcome

    @app.task(base=WireTask, name=FIRE_CLOCK_TASK, bind=True, ignore_result=True, max_retries=None, shared=False)
    def fire_clock(self: Any, execution_id: str, seq: int, run: int = 0) -> str:
        engine = durable.engine
        use_session(engine.store, self.request, execution_id)
        try:
            outcome = eagerly(self, engine, execution_id, lambda: engine.fire_clock(execution_id, seq, run))
        except StoreUnavailable as exc:
            raise self.retry(exc=exc, countdown=1.0) from exc
        if outcome == ClockOutcome.EARLY:  # delivered before its time (clock skew): try again shortly
            raise self.retry(countdown=0.05, max_retries=100)
        if outcome == ClockOutcome.MISSING and retry_stale(self, engine.counters, "no such timer step"):
            return "missing (retrying)"
        return outcome

    @app.task(base=WireTask, name=FIRE_DUE_CLOCKS_TASK, ignore_result=True, shared=False)
    def fire_due_clocks() -> int:
        return clock_pass(durable.engine)

    @app.task(base=WireTask, name=START_SCHEDULED_TASK, ignore_result=True, shared=False)
    def start_scheduled(schedule_name: str, workflow: str, payload: dict[str, Any], period: float) -> str:
        engine = durable.engine
        # a message's arguments are not a caller's: the id gets the check start() gives one
        wid = check_workflow_id(tick_id(schedule_name, period, engine.clock.now()), "scheduled workflow id")
        # its workflow's limit, as start() takes it: a tick waits for a slot like any start
        fields = limit_of_stored(engine.registry.workflow(workflow), payload, engine.clock.now())
        created = engine.create_execution(workflow, payload, wid, None, **fields)
        return f"{wid} {'started' if created else 'already started'}"

    @app.task(base=WireTask, name=RECOVER_TASK, ignore_result=True, shared=False)
    def recover() -> dict[str, int]:
        return dict(recovery_pass(durable.engine).__dict__)
