"""A workflow test environment with time skipping (like Temporal's ``WorkflowEnvironment``).

Everything runs in-process on a fake clock: drives and activities execute synchronously, and
when the workflow waits for a timer the clock jumps straight to it. A workflow that sleeps 30
days, or waits 2 days for a signal that never comes, completes in milliseconds, without
``time.sleep``. Timers fire through the same path as beat's clock scan.

Activities are retried as a worker retries them: by their own Celery options
(``autoretry_for``, ``dont_autoretry_for``, ``max_retries``, ``default_retry_delay``,
``retry_backoff``; never ``NonRetryableError``), each retry waiting its delay (without jitter)
on the fake clock. ``async def`` activities run to completion as on a worker.

>>> env = WorkflowEnvironment(durable)
>>> handle = env.start(fulfil_order, order)
>>> env.signal(handle, "approval", Approval(ok=True))
>>> env.result(handle)
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable.engine.activities.attempts import run_awaitable
from celery_durable.engine.activities.context import ActivityInterrupt
from celery_durable.engine.activities.delivery import Delivery
from celery_durable.engine.admin.operator import Admin, ExecutionPage
from celery_durable.engine.core import Engine
from celery_durable.engine.dispatcher import ActivityRequest, InlineDispatcher
from celery_durable.engine.documents.model import EXEC_ID, Settings
from celery_durable.engine.documents.records import is_terminal
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import limit_of_stored
from celery_durable.engine.limits.table import rate_opens
from celery_durable.engine.registry import Registry
from celery_durable.engine.schedules.firing import due_of, fire_due
from celery_durable.engine.schedules.spec import CANCEL_OTHER
from celery_durable.errors import DurableError, NonRetryableError
from celery_durable.glue.durable_activity import task_retry
from celery_durable.handle import WorkflowHandle, answer_as
from celery_durable.retry import TaskRetry
from celery_durable.schedules import Schedules
from celery_durable.stores.base import Store
from celery_durable.stores.memory import MemoryStore

if TYPE_CHECKING:
    from celery import Celery

    from celery_durable.app import Durable, Workflow, WorkflowOptions

__all__ = ["FakeClock", "WorkflowEnvironment"]

R = TypeVar("R")


def _next_tick(every: Any, after: float) -> float:
    """When a schedule (a ``timedelta`` aligned to the epoch, or a Celery ``crontab``) next fires after ``after``."""
    if isinstance(every, timedelta):
        period = every.total_seconds()
        return (math.floor(after / period) + 1) * period
    last = datetime.fromtimestamp(after, tz=UTC)
    pinned = copy.copy(every)
    pinned.nowfun = lambda: last  # the estimate counts from the fake clock, not the wall clock
    nxt: float = (last + pinned.remaining_estimate(last)).timestamp()
    return max(after + 0.001, nxt)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float | None = None) -> None:
        self.t = time.time() if start is None else start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.t += seconds


class WorkflowEnvironment:
    """In-process engine on a fake clock. Pass a :class:`Durable` (its workflows) or a registry.

    ``activity_attempts`` is deprecated: activities retry by their own Celery options, as on a
    worker. It only still applies to activities that are no Celery task (registered directly
    in a :class:`Registry`): that many attempts, retried at once, never ``NonRetryableError``.
    """

    def __init__(
        self,
        durable: Durable | Registry | None = None,
        *,
        store: Store | None = None,
        start: datetime | float | None = None,
        activity_attempts: int | None = None,
    ) -> None:
        if activity_attempts is not None:
            warnings.warn(
                "WorkflowEnvironment(activity_attempts=...) is deprecated: activities now retry by "
                "their own Celery options (autoretry_for, max_retries, ...) as on a worker; it only "
                "applies to activities that are not Celery tasks",
                DeprecationWarning,
                stacklevel=2,
            )
            if activity_attempts < 1:
                raise ValueError("activity_attempts must be >= 1")
        self._fallback = (
            TaskRetry()
            if activity_attempts is None
            else TaskRetry(autoretry_for=(Exception,), max_retries=activity_attempts - 1, countdown=0.0)
        )
        if isinstance(start, datetime):
            start = start.timestamp()
        self.clock = FakeClock(start)
        registry = durable if isinstance(durable, Registry) else (durable.registry if durable else Registry())
        self.dispatcher = InlineDispatcher()
        self.store = store or MemoryStore()
        # the app's own settings (attempts, timeouts, grace periods), as its workers would run
        settings = durable.settings if durable is not None and not isinstance(durable, Registry) else Settings()
        self.engine = Engine(self.store, self.dispatcher, registry, settings, self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher)
        self.dispatcher.handlers["activity"] = self._activity
        #: where activities' Celery tasks (and so their retry options) are looked up
        self._app: Celery | None = None if durable is None or isinstance(durable, Registry) else durable.app
        #: its schedules tick as the clock advances
        self._durable = None if isinstance(durable, Registry) else durable
        #: activity retries waiting for their delay: (due time, message), as Celery's countdown
        self.retries: list[tuple[float, ActivityRequest]] = []
        # library signals (celery_durable.glue.hooks) fire here as they do on workers
        from celery_durable.glue.hook_receivers import forward_event

        self.engine.subscribe(forward_event)
        #: managed schedules on this environment's store (``durable.schedules``' methods); they fire
        #: as ``advance`` moves the clock past their ticks
        self.schedules = Schedules(lambda: self.engine, registry, lambda: getattr(self._durable, "_schedules", {}))

    # --- activities ----------------------------------------------------------------------

    def _retry_of(self, name: str) -> TaskRetry:
        """The activity's retry options: its Celery task's (this app's, or the current app's)."""
        if self._app is None:
            from celery import current_app

            app: Any = current_app
        else:
            app = self._app
        task = app.tasks.get(name)
        return self._fallback if task is None else task_retry(task)

    def _activity(self, req: ActivityRequest) -> None:
        """One delivery of an activity message, as ``_run_attempt`` runs it on a worker."""
        eng = self.engine
        # req.holder: its scheduling commit took its lease (an eager dispatcher: InlineDispatcher(eager=True))
        attempt, _why = eng.activities.begin(
            req.execution_id, req.seq, req.run, delivery=Delivery.of_request(req), claimed=req.holder
        )
        if attempt is None:
            return
        act = eng.registry.activity(req.name)
        if act is None:
            err = NonRetryableError(f"activity {req.name!r} is not registered here")
            eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=err))
            return
        self.worker.executed.append((req.execution_id, req.seq, req.name))
        holds = bool(act.options.get("pause_on_failure"))  # a failure for good pauses it (engine/activities/holds.py)
        try:
            args, kwargs = act.codec.decode_args({"args": req.args, "kwargs": req.kwargs})
        except Exception as exc:  # final, as on a worker: only the function's own errors retry
            if not (holds and eng.activities.hold(attempt, exc)):
                eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=exc))
            return
        actx = eng.activities.context(attempt, act.options)  # activity.heartbeat() and cancels
        try:
            with actx:
                value = run_awaitable(act.fn(*args, **kwargs))
        except (Exception, ActivityInterrupt) as raised:
            failure: BaseException | None = raised
            if isinstance(raised, ActivityInterrupt):  # cancelled (nothing to record), or stalled
                failure = eng.activities.interrupted(attempt, actx, raised)
                if failure is None:
                    return
            assert failure is not None
            # attempts so far minus one: Celery's request.retries (no lost deliveries in-process)
            delay = self._retry_of(req.name).next_delay(attempt.number - 1, failure)
            if delay is None and holds and eng.activities.hold(attempt, failure):
                return  # its execution paused, the step held for the unpause
            if delay is None:
                eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=failure))
            else:
                eng.activities.retrying(attempt, delay, failure)
                self.retries.append((self.clock.now() + delay, req))
                self._release_retries()
            return
        try:
            doc = eng.activities.result_doc(attempt, value=act.codec.encode_result(value))
        except Exception as exc:  # a result that cannot be stored: a failure for good, as on a worker
            if holds and eng.activities.hold(attempt, exc):
                return
            doc = eng.activities.result_doc(attempt, error=exc)
        eng.activities.complete(attempt, doc)

    def _release_retries(self) -> None:
        """Send the activity retries whose delay has passed on the fake clock."""
        now = self.clock.now()
        due = [req for at, req in self.retries if at <= now]
        self.retries = [(at, req) for at, req in self.retries if at > now]
        for req in due:
            self.dispatcher.send_activity(req)

    # --- driving -------------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Run every queued drive and activity (and what they queue)."""
        self.worker.run()

    def advance(self, delta: timedelta | float) -> None:
        """Move the clock forward, fire what became due, and run.

        The ticks of ``durable.schedule(...)`` that fall in the window start their executions at
        their time, as beat would (ids ``<name>@<tick>``). Only ``advance`` fires ticks:
        ``skip_to_next_timer`` and ``result`` jump over them."""
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError("time only moves forward")
        target = self.clock.t + seconds
        for at, workflow, payload, wid in self._schedule_ticks(self.clock.t, target):
            self._managed_until(at)
            self.clock.t = max(self.clock.t, at)
            self._scan()  # what was due before the tick fires first
            # its workflow's limit, as beat's start_scheduled takes it
            fields = limit_of_stored(self.engine.registry.workflow(workflow), payload, self.clock.now())
            self.engine.create_execution(workflow, payload, wid, None, **fields)
        self._managed_until(target)
        self.clock.t = target
        self._scan()

    def _managed_until(self, until: float) -> None:
        """Step the clock through the due times of managed schedules up to ``until``, firing each
        at its time as beat's clock scan would (engine/schedules/firing.py)."""
        seen: tuple[str, float] | None = None
        while (due := self._next_firing(until)) is not None:
            if due == seen:
                break  # its firing did not move it (an error, logged): advance goes on
            seen = due
            # the timers due before it fire first, at their time: a tick sees the executions
            # that ended before it ended, as on workers
            while (clock := self.engine.timers.next_clock()) is not None and clock < due[1]:
                self.clock.t = max(self.clock.t, clock)
                self._scan()
            self.clock.t = max(self.clock.t, due[1])
            self._scan()

    def _next_firing(self, until: float) -> tuple[str, float] | None:
        """The next managed schedule to fire (its id, when) up to ``until``. One that only polls
        for its running executions to end (a kept tick, due every clock interval) is fired when
        one can end here: at the next timer, retry, delayed effect or rate opening (or its next
        tick), instead of every second of the fake clock."""
        store, best = self.engine.store, None
        for ref in store.scan_due("schedule", until, 100):
            at, doc = ref.due_at, store.read(ref.pk, ref.id)
            if doc is not None and self._only_polls(doc):
                events = [when for when, _ in self.retries + self.worker.delayed] + self._rate_openings()
                events.append(due_of(doc) or math.inf)
                events.append(clock if (clock := self.engine.timers.next_clock()) is not None else math.inf)
                at = max(at, min(events))
            if at <= until and (best is None or at < best[1]):
                best = (ref.id, at)
        return best

    def _only_polls(self, doc: dict[str, Any]) -> bool:
        """Whether a firing of schedule ``doc`` now could only find its running executions still
        running: a tick kept, nothing to create, every one it started running with no cancel
        asked (a cancel asked, or one cancel_other would ask, ends it at the next scan)."""
        if doc.get("buffered") is None or doc.get("starting") or doc.get("overlap") == CANCEL_OTHER:
            return False
        running = [self.engine.store.read(eid, EXEC_ID) for eid in doc.get("running") or ()]
        return bool(running) and all(ex and not is_terminal(ex) and not ex.get("cancel_requested") for ex in running)

    def _schedule_ticks(self, after: float, until: float) -> list[tuple[float, str, dict[str, Any], str]]:
        """``(time, workflow, payload, id)`` of the schedule ticks in ``(after, until]``, in time order."""
        from celery_durable.glue.tasks import tick_id

        ticks = []
        for entry in getattr(self._durable, "_schedules", {}).values():  # what Durable.schedule() registered
            name, workflow, payload, period = entry["args"]
            at = _next_tick(entry["schedule"], after)
            while at <= until:
                ticks.append((at, workflow, payload, tick_id(name, period, at)))
                at = _next_tick(entry["schedule"], at)
        return sorted(ticks, key=lambda tick: tick[0])

    def skip_to_next_timer(self) -> bool:
        """Jump to the earliest pending timer (or activity retry) and fire it; False when there is none."""
        pending = [at for at, _ in self.retries]
        clock = self.engine.timers.next_clock()
        if clock is not None:
            pending.append(clock)
        pending += self._rate_openings()
        if not pending:
            return False
        nxt = min(pending)
        self.clock.t = max(self.clock.t, nxt)
        self._scan()
        return True

    def _rate_openings(self) -> list[float]:
        """When a rate limit lets a waiting step or execution start (engine/limits/table.py)."""
        store, now = self.engine.store, self.clock.now()
        docs = [store.read(ref.pk, LIMIT_DOC_ID) for ref in store.scan_due("limit", float("inf"), 100)]
        return [t for t in (rate_opens(d, now) for d in docs if d is not None) if t is not None]

    def _scan(self) -> None:
        """What beat does when time passes: fire due timers, grant limits' slots (their recovery
        scan), re-send due effects (retries)."""
        self.engine.timers.fire_due_clocks()
        fire_due(self.engine)  # managed schedules: beat's clock scan fires them after the timers
        self.engine.limits.scan()
        self._release_retries()
        self.worker.release_due()
        self.engine.outbox.scan()
        self.run_until_idle()

    # --- client side -----------------------------------------------------------------------

    def start(
        self,
        workflow: Workflow[Any, R] | WorkflowOptions[Any, R],
        *args: Any,
        _workflow_id: str | None = None,
        _search: dict[str, Any] | None = None,
        _memo: Any = None,
        **kwargs: Any,
    ) -> WorkflowHandle[R]:
        """Start ``workflow`` (or ``workflow.options(...)``, its options) and run until idle."""
        dedup, timing, queueing = None, None, None
        if not hasattr(workflow, "definition"):  # options (not imported here: app imports this module's users)
            opts: WorkflowOptions[Any, R] = workflow
            _workflow_id = opts.workflow_id if _workflow_id is None else _workflow_id
            _search = opts.search if _search is None else _search
            _memo, dedup, timing = opts.memo if _memo is None else _memo, opts.dedup, opts.timing
            queueing, definition = opts.queueing, opts.workflow.definition
        else:
            definition = workflow.definition
        eid, _ = self.engine.start(
            definition,
            args,
            kwargs,
            workflow_id=_workflow_id,
            search=_search,
            memo=_memo,
            dedup=dedup,
            timing=timing,
            queueing=queueing,
        )
        self.run_until_idle()
        return WorkflowHandle(self.engine, eid, definition)

    def list_executions(self, **filters: Any) -> ExecutionPage:
        """``durable.list_executions(...)`` on this environment's store (same keywords)."""
        created = {k: filters.pop(k) for k in ("started_after", "started_before") if k in filters}
        return Admin(self.engine).executions(
            created_after=created.get("started_after"), created_before=created.get("started_before"), **filters
        )

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        """A handle to an execution of this environment."""
        return WorkflowHandle(self.engine, workflow_id)

    def signal(self, handle: WorkflowHandle[Any] | str, name: str, value: Any) -> bool:
        ok = self.engine.signal(handle if isinstance(handle, str) else handle.id, name, value)
        self.run_until_idle()
        return ok

    def update(
        self,
        handle: WorkflowHandle[Any] | str,
        name: str,
        *args: Any,
        update_id: str | None = None,
        result_type: Any = None,
    ) -> Any:
        """``handle.update(name, *args)``, run until idle: the handler's answer (decoded as
        ``result_type`` when given), or its error raised (:class:`DurableTimeoutError` if the
        workflow did not reach a wait point to handle it)."""
        eid = handle if isinstance(handle, str) else handle.id
        n = self.engine.updates.send(eid, name, args, update_id=update_id)
        self.run_until_idle()
        return answer_as(self.engine.updates.outcome(eid, n, timeout=0), result_type)

    def signal_with_start(
        self, options: WorkflowOptions[Any, R], signal: str, value: Any, *args: Any, **kwargs: Any
    ) -> WorkflowHandle[R]:
        """``options.signal_with_start(signal, value, *args, **kwargs)`` here, run until idle."""
        handle = options.signal_with_start_on(self.engine, signal, value, args, kwargs)
        self.run_until_idle()
        return handle

    def update_with_start(
        self,
        options: WorkflowOptions[Any, R],
        update: str,
        update_args: Sequence[Any] = (),
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        update_id: str | None = None,
    ) -> tuple[WorkflowHandle[R], Any]:
        """``options.update_with_start(...)`` here, run until idle: the handle and the answer."""
        handle, n = options.send_update_with_start(self.engine, update, update_args, args, kwargs, update_id)
        self.run_until_idle()
        return handle, self.engine.updates.outcome(handle.id, n, timeout=0)

    def cancel(self, handle: WorkflowHandle[Any]) -> bool:
        ok = handle.cancel()
        self.run_until_idle()
        return ok

    def result(self, handle: WorkflowHandle[R], max_time: timedelta = timedelta(days=3650)) -> R:
        """Run, skipping time from timer to timer, until the execution ends; return its result."""
        limit = self.clock.t + max_time.total_seconds()
        self.run_until_idle()
        while not handle.poll().done:
            if self.clock.t > limit or not self.skip_to_next_timer():
                raise DurableError(
                    f"execution {handle.id!r} is still {handle.status()} and nothing is scheduled: "
                    "it waits for a signal or an external event"
                )
        return handle.result(timeout=0)
