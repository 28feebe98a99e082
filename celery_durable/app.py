"""``Durable(app)``: the extension object that binds celery_durable to a Celery app."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from celery import Celery, current_app
from celery.schedules import crontab
from celery.schedules import schedule as celery_schedule

from celery_durable import workflow as _wf
from celery_durable.day_two import DayTwo
from celery_durable.engine.admin.operator import (
    Admin,
    ExecutionDetail,
    ExecutionPage,
    ExecutionSummary,
    PurgeReport,
    StepRecord,
)
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.core import Engine
from celery_durable.engine.documents.checks import check_workflow_id
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.engine.documents.search import start_fields
from celery_durable.engine.limits.spec import Limit, WorkflowQueueing
from celery_durable.engine.registry import Registry, WorkflowDef, add_shared_workflow
from celery_durable.engine.replay.context import DurableFuture, current_context, require_context
from celery_durable.engine.starts.deadlines import Timing, timing_of
from celery_durable.engine.starts.dedup import OnConflict
from celery_durable.errors import ConfigurationError
from celery_durable.glue import batch as _batch  # noqa: F401 - declares the batch workflow and its activity
from celery_durable.glue.beat_scans import install_beat_scans
from celery_durable.glue.beat_shutdown import install_beat_shutdown
from celery_durable.glue.bootsteps import DurableEventsStep, DurableMetricsStep, DurableShutdownStep, DurableStep
from celery_durable.glue.extension import EXTENSION_ATTR, durable_of
from celery_durable.glue.hook_receivers import forward_event, install
from celery_durable.glue.outbox import OUTBOX_SCAN_TASK, CeleryEffectSender, Outbox
from celery_durable.glue.tasks import (
    FIRE_DUE_CLOCKS_TASK,
    RECOVER_TASK,
    START_SCHEDULED_TASK,
    CeleryDispatcher,
    register_tasks,
)
from celery_durable.glue.wire import check as check_wire
from celery_durable.handle import WorkflowHandle
from celery_durable.observability import Counters
from celery_durable.settings import Settings
from celery_durable.start_options import WorkflowOptions, dedup_of, queueing_of
from celery_durable.stores import Store, store_from_url
from celery_durable.stores.push.base import REDIS_SCHEMES
from celery_durable.stores.push.selection import build_notifier

__all__ = ["Durable", "Workflow", "WorkflowOptions"]

P = ParamSpec("P")
R = TypeVar("R")


class Workflow(Generic[P, R]):
    """A workflow function registered with a :class:`Durable`.

    ``start()`` runs it durably on the workers; calling it directly outside a workflow just
    runs the function (handy in unit tests of business logic).
    """

    def __init__(self, durable: Durable, definition: WorkflowDef) -> None:
        self._durable = durable
        self.definition = definition
        self.name = definition.name
        self.__wrapped__ = definition.fn
        self.__doc__ = definition.fn.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Inside a workflow: run as a child workflow and wait for it. Outside: a plain call."""
        if current_context() is not None:
            value: R = self.start_child(*args, **kwargs).result()
            return value
        result: R = self.definition.fn(*args, **kwargs)
        return result

    # ``_workflow_id`` cannot join a ParamSpec's parameters (PEP 612), so a call without it is
    # checked against the workflow's signature and a call with it is not: ``options(workflow_id=)``
    # is the checked way to give an id.
    @overload
    def start_child(self, *args: P.args, **kwargs: P.kwargs) -> DurableFuture[R]: ...
    @overload
    def start_child(self, *args: Any, _workflow_id: str | None, **kwargs: Any) -> DurableFuture[R]: ...
    def start_child(self, *args: Any, **kwargs: Any) -> DurableFuture[R]:
        """Inside a workflow: start this workflow as a child; ``.result()`` waits for it.

        The child's id derives from the parent's id and the step (idempotent on replay) unless
        ``_workflow_id`` is given. Cancelling the parent cancels its running children.
        """
        workflow_id = kwargs.pop("_workflow_id", None)
        ctx = require_context(f"{self.name}.start_child()")
        return ctx.start_child(self.definition, args, kwargs, workflow_id)

    # One signature, the workflow's own: mypy checks every start. ``_workflow_id=``, ``_search=``
    # and ``_memo=`` still work at run time, but cannot join a ParamSpec's parameters (PEP 612),
    # so mypy flags them rather than stop checking the call: ``options(workflow_id=...)`` is the
    # typed way (an untyped overload taking them made ``start("not an order", _workflow_id=...)``
    # pass mypy: ../shared/repro/operable/newcomer_typed_start_with_id.py).
    def start(self, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle[R]:
        """Start (or join, when its id exists) an execution; validate in the caller. The id, search
        attributes and memo: ``options(workflow_id=, search=, memo=)`` (README "Search attributes
        and memo"); a joined execution keeps its own."""
        rest: dict[str, Any] = dict(kwargs)
        workflow_id = rest.pop("_workflow_id", None)
        search, memo = rest.pop("_search", None), rest.pop("_memo", None)
        return self._start(args, rest, workflow_id, search, memo)

    def _start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        workflow_id: str | None,
        search: dict[str, Any] | None = None,
        memo: Any = None,
        dedup: tuple[str, OnConflict] | None = None,
        timing: Timing | None = None,
        queueing: WorkflowQueueing | None = None,
    ) -> WorkflowHandle[R]:
        eid, _ = self._durable.engine.start(
            self.definition,
            args,
            kwargs,
            workflow_id=workflow_id,
            search=search,
            memo=memo,
            dedup=dedup,
            timing=timing,
            queueing=queueing,
        )
        return WorkflowHandle(self._durable.engine, eid, self.definition)

    def options(
        self,
        *,
        workflow_id: str | None = None,
        search: dict[str, Any] | None = None,
        memo: Any = None,
        dedup_key: str | None = None,
        on_conflict: Literal["reject", "return-existing", "latest-wins"] = "reject",
        timeout: timedelta | float | None = None,
        start_delay: timedelta | float | None = None,
        debounce: timedelta | float | None = None,
        limit: Limit | None = None,
        limit_key: str | int | None = None,
        priority: int | None = None,
    ) -> WorkflowOptions[P, R]:
        """This workflow with start options, its arguments type-checked:
        ``fulfil.options(workflow_id=f"order-{o.id}", search={"customer": o.customer}).start(o)``
        (same as ``_workflow_id=``, ``_search=``, ``_memo=``). Checked here, before anything is stored.

        ``dedup_key``: at most one running execution holds the key (a singleton, a deduplicated
        start). A start while one runs is settled by ``on_conflict``: ``"reject"`` raises
        :class:`DuplicateStart`; ``"return-existing"`` returns a handle to the running one;
        ``"latest-wins"`` cancels the running one (its compensations run) and starts this one.

        ``timeout`` (seconds or a ``timedelta``, > 0): its deadline, counted from its first drive; then
        :class:`WorkflowTimedOutError` is raised at its suspension point, its compensations run and
        it ends ``timed_out`` (a child's deadline is the earlier of its own and its parent's).
        ``start_delay`` (>= 0): created now, ``scheduled``, first driven that much later (top-level
        starts only). docs/guides/deadlines.md.

        ``debounce`` (> 0, with a ``dedup_key``): a start delayed by that quiet period; another
        debounced start with the key while it has not started yet gives it its input and moves its
        start a full quiet period on (the latest input wins). docs/guides/dedup.md.

        ``limit`` (a :class:`Limit`; default: the workflow's ``limit=``): the execution is created
        ``queued`` and starts when it gets a slot, held until it ends. ``limit_key``: its key (instead
        of the limit's key function of the arguments); ``priority``: lower starts first.
        docs/guides/limits.md."""
        start_fields(search, memo)
        timing = timing_of(timeout, start_delay, debounce)
        if debounce is not None and dedup_key is None:
            raise ConfigurationError("debounce needs a dedup_key: the starts it merges are those with the same key")
        return WorkflowOptions(
            self,
            None if workflow_id is None else check_workflow_id(workflow_id),
            search=search,
            memo=memo,
            dedup=dedup_of(dedup_key, on_conflict),
            timing=timing,
            queueing=queueing_of(limit, limit_key, priority),
        )

    def handle(self, workflow_id: str) -> WorkflowHandle[R]:
        return WorkflowHandle(self._durable.engine, workflow_id, self.definition)


class SharedWorkflow(Workflow[P, R]):
    """A workflow declared with :func:`shared_workflow`: known to every :class:`Durable`, and
    started through the current Celery app's (as Celery's ``shared_task`` is sent by it)."""

    def __init__(self, definition: WorkflowDef) -> None:  # noqa: D107 - no Durable yet
        self.definition = definition
        self.name = definition.name
        self.__wrapped__ = definition.fn
        self.__doc__ = definition.fn.__doc__

    @property
    def _durable(self) -> Durable:  # type: ignore[override]
        app = current_app._get_current_object()
        if getattr(app, EXTENSION_ATTR, None) is None:
            raise ConfigurationError(
                f"shared workflow {self.name!r}: the current Celery app {app.main!r} has no Durable "
                "(create Durable(app) where the app is defined, e.g. proj/celery.py)"
            )
        return Durable.of(app)


@overload
def shared_workflow(fn: Callable[P, R]) -> SharedWorkflow[P, R]: ...
@overload
def shared_workflow(
    *, name: str | None = None, signals: dict[str, Any] | None = None, limit: Limit | None = None
) -> Callable[[Callable[P, R]], SharedWorkflow[P, R]]: ...
def shared_workflow(
    fn: Any = None, *, name: str | None = None, signals: dict[str, Any] | None = None, limit: Limit | None = None
) -> Any:
    """``@durable.workflow`` without a ``Durable`` at hand, for reusable (Django) apps, as Celery's
    ``@shared_task``: every Durable's workers run it, and ``start()`` goes through the current
    app's Durable. Same options and rules as :meth:`Durable.workflow`."""

    def wrap(f: Callable[P, R]) -> SharedWorkflow[P, R]:
        _refuse_non_plain(f)
        return SharedWorkflow(add_shared_workflow(name or f"{f.__module__}.{f.__qualname__}", f, signals, limit))

    return wrap(fn) if fn is not None else wrap


def _redis_url(app: Celery) -> str | None:
    """The Celery result backend's URL, else the broker's, if it is Redis (result push)."""
    for url in (app.conf.result_backend, app.conf.broker_url):
        first = url[0] if isinstance(url, list | tuple) and url else url
        if isinstance(first, str):
            first = first.split(";", 1)[0].strip()  # a failover list: the first
            if first.startswith(REDIS_SCHEMES):
                return first
    return None


def _refuse_non_plain(fn: Callable[..., Any]) -> None:
    """A workflow is replayed step by step on the worker's thread: a coroutine (or generator)
    would need a deterministic event loop to suspend and resume it, which there is not."""
    kinds = (
        (inspect.iscoroutinefunction, "an async def function"),
        (inspect.isasyncgenfunction, "an async generator"),
        (inspect.isgeneratorfunction, "a generator function"),
    )
    kind = next((what for test, what in kinds if test(fn)), None)
    if kind is not None:
        raise TypeError(
            f"workflows must be plain functions; async activities are supported "
            f"({getattr(fn, '__qualname__', fn)!r} is {kind}: call async code from a @durable_activity)"
        )


def _interval_of(every: object) -> timedelta | crontab:
    """``every`` of :meth:`Durable.schedule`: a ``timedelta`` or a ``crontab`` as given; beat's
    seconds (a number) and a Celery ``schedule(run_every)`` as the ``timedelta`` they mean (the
    listings and WorkflowEnvironment read those two kinds only); anything else refused."""
    if isinstance(every, timedelta | crontab):
        return every
    if isinstance(every, int | float) and not isinstance(every, bool):
        return timedelta(seconds=every)
    if isinstance(every, celery_schedule) and isinstance(every.run_every, timedelta):
        return every.run_every
    raise ConfigurationError(f"every must be a timedelta or a Celery crontab, not {every!r}")


class Durable(DayTwo):
    """Durable workflows on a Celery app: ``durable = Durable(app)``.

    Settings come from ``app.conf`` keys prefixed ``durable_`` (see :mod:`celery_durable.settings`);
    keyword arguments override them. ``store`` may be a URL or a :class:`Store`.
    """

    def __init__(self, app: Celery, store: Store | str | None = None, **settings: Any) -> None:
        if getattr(app, EXTENSION_ATTR, None) is not None:
            raise ConfigurationError("this Celery app already has a Durable extension")
        self.app = app
        self._overrides = settings
        self._store_arg = store
        self.registry = Registry()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._schedules: dict[str, dict[str, Any]] = {}
        setattr(app, EXTENSION_ATTR, self)
        register_tasks(app, self)
        # the worker's own steps: once the pool drained (or at once on a cold shutdown) they stop
        # this process's heartbeat and give back its leases
        app.steps["worker"].add(DurableStep)
        app.steps["worker"].add(DurableMetricsStep)  # durable_metrics_port: Prometheus /metrics
        app.steps["consumer"].add(DurableShutdownStep)
        app.steps["consumer"].add(DurableEventsStep)  # eager activities send task events as the worker does
        #: the effect outbox (docs/architecture.md §9): ``durable.outbox.enqueue(...)``, ``@durable.effect``
        self.outbox = Outbox(self)
        install(self)
        install_beat_shutdown()  # celery beat: SIGTERM mid-publish exits 0, the schedule saved
        install_beat_scans()  # celery beat: the scans run in its process (durable_scans_in_beat)
        if app.configured:  # the config was already read (e.g. app.conf.update() ran first)
            check_wire(app)  # a serializer it cannot send with fails here, not at the first send
            self._install_beat()
        else:
            app.on_after_configure.connect(self._install_beat, weak=False)

    @staticmethod
    def of(app: Celery) -> Durable:
        """The extension installed on ``app``."""
        durable = durable_of(app)
        assert isinstance(durable, Durable)
        return durable

    # --- lazily built, per process ------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return Settings.from_conf(self.app.conf, **self._overrides)

    @property
    def engine(self) -> Engine:
        engine = self._engine
        if engine is None:
            with self._lock:
                if self._engine is None:
                    check_wire(self.app)  # (configured after Durable(app): here, before any send)
                    settings = self.settings
                    store = self._store_arg
                    if store is None or isinstance(store, str):
                        store = store_from_url(store or settings.store_url, **settings.store_options)
                    self._store_arg = store
                    dispatcher = CeleryDispatcher(
                        self.app, float(settings.timer_fast_path_max), CeleryEffectSender(self.app, self.outbox.effects)
                    )
                    # handle.result() is woken by a push (stores/push/base.py): the store's own, else Redis
                    notifier = build_notifier(settings.result_push, store, _redis_url(self.app), TERMINAL)
                    engine = Engine(store, dispatcher, self.registry, settings, notifier=notifier)
                    engine.subscribe(forward_event)
                    self._engine = engine
                engine = self._engine
        return engine

    @property
    def engine_if_built(self) -> Engine | None:
        """The engine if this process built one already (never builds it)."""
        return self._engine

    @property
    def store(self) -> Store:
        return self.engine.store

    @property
    def counters(self) -> Counters:
        """Event counters of this process (for a Prometheus exporter)."""
        return self.engine.counters

    def configure(self, store: Store | str | None = None, **settings: Any) -> None:
        """Change the store and/or settings of this process (tests, scripts); rebuilds the engine."""
        with self._lock:
            if self._engine is not None:
                self._engine.shutdown(release=True)
            self._engine = None
            self._store_arg = store
            self._overrides = {**self._overrides, **settings}

    def reset_after_fork(self) -> None:
        with self._lock:
            if isinstance(self._store_arg, Store):
                self._store_arg.reopen()
            if self._engine is not None:
                self._engine.cache.invalidate()

    def shutdown(self) -> None:
        """Give back this process's leases and stop its heartbeat thread (worker shutdown)."""
        engine = self._engine
        if engine is not None:
            engine.shutdown(release=True)

    def schedule(
        self,
        name: str,
        workflow: Workflow[Any, Any],
        every: timedelta | Any,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Start ``workflow(*args, **kwargs)`` on a schedule through beat.

        ``every`` is a ``timedelta`` (ticks aligned to the epoch; seconds, or a Celery
        ``schedule(run_every)``, are read as one) or a Celery ``crontab``. Each
        tick gets the workflow id ``"{name}@{tick}"``, so two beats by mistake still start one
        execution per tick. The payload is validated now, not at the first tick.
        """
        check_workflow_id(name, "schedule name")  # its ticks' ids start with it: checked the same way
        every = _interval_of(every)
        payload = workflow.definition.codec.encode_args(args, kwargs)
        period = every.total_seconds() if isinstance(every, timedelta) else 60.0
        if period <= 0:
            raise ConfigurationError("a schedule period must be positive")
        entry = {
            "task": START_SCHEDULED_TASK,
            "schedule": every,
            "args": [name, workflow.name, payload, period],
        }
        self._schedules[f"{START_SCHEDULED_TASK}:{name}"] = entry
        if self.app.configured:
            self._install_beat()

    def _install_beat(self, **_: Any) -> None:
        settings = self.settings
        if not settings.install_beat:
            return
        schedule = dict(self.app.conf.beat_schedule or {})
        schedule.update(self._schedules)
        if settings.scans_in_beat:  # beat runs them itself (glue/beat_scans.py): no message
            self.app.conf.beat_schedule = schedule
            return
        schedule.setdefault(
            RECOVER_TASK,
            {"task": RECOVER_TASK, "schedule": timedelta(seconds=float(settings.recovery_interval))},
        )
        schedule.setdefault(
            OUTBOX_SCAN_TASK,
            {"task": OUTBOX_SCAN_TASK, "schedule": timedelta(seconds=float(settings.outbox_scan_interval))},
        )
        schedule.setdefault(
            FIRE_DUE_CLOCKS_TASK,
            {"task": FIRE_DUE_CLOCKS_TASK, "schedule": timedelta(seconds=float(settings.clock_interval))},
        )
        self.app.conf.beat_schedule = schedule

    # --- declaring ----------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[P, R]) -> Workflow[P, R]: ...
    @overload
    def workflow(
        self, *, name: str | None = None, signals: dict[str, Any] | None = None, limit: Limit | None = None
    ) -> Callable[[Callable[P, R]], Workflow[P, R]]: ...
    def workflow(
        self,
        fn: Any = None,
        *,
        name: str | None = None,
        signals: dict[str, Any] | None = None,
        limit: Limit | None = None,
    ) -> Any:
        """Register a workflow function; its name (default ``module.qualname``) is stored.

        A workflow is a plain function: ``async def`` (and generator) functions are refused with
        a ``TypeError`` (replaying them would need a deterministic event loop); activities may be async.

        ``signals`` declares signal names and their types: values sent to them are validated
        in the sender.

        ``limit`` (a :class:`Limit`, its ``key`` a function of the workflow's arguments): each
        execution is created ``queued`` and starts when it gets a slot of its key, which it holds
        until it ends (docs/guides/limits.md).
        """

        def wrap(f: Callable[P, R]) -> Workflow[P, R]:
            _refuse_non_plain(f)
            wf_name = name or f"{f.__module__}.{f.__qualname__}"
            return Workflow(self, self.registry.add_workflow(wf_name, f, signals, limit))

        return wrap(fn) if fn is not None else wrap

    def effect(self, effect_type: str, **options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Register an outbox effect handler, a Celery task ``celery_durable.effect.<type>``.

        Options: ``replay_safe`` (True: requeued after its worker died; False: process-bound,
        failed instead), ``max_attempts`` (5), ``retry`` (a :class:`RetryPolicy`; default backoff
        min(30 s, 100 ms·2^(attempt−1))), ``non_retryable`` (exception types that skip retries),
        ``non_retryable_status`` ("failed" or "succeeded"), ``timeout`` (s), ``interruptible``,
        ``queue``, ``name``.
        """
        return self.outbox.effect(effect_type, **options)

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        """A handle to an existing execution by id."""
        return WorkflowHandle(self.engine, workflow_id)

    def signal(self, workflow_id: str, name: str, value: Any) -> bool:
        """Send a signal from anywhere (kept for the next wait); False when the execution has ended."""
        return self.engine.signal(workflow_id, name, value)

    def update(
        self,
        workflow_id: str,
        name: str,
        *args: Any,
        timeout: float | None = None,
        update_id: str | None = None,
        result_type: Any = None,
    ) -> Any:
        """Update a running workflow and return its handler's answer (``WorkflowHandle.update``)."""
        return self.handle(workflow_id).update(
            name, *args, timeout=timeout, update_id=update_id, result_type=result_type
        )

    # --- operators: the read model and its operations (celery_durable.engine.admin.operator) --------

    @property
    def admin(self) -> Admin:
        return Admin(self.engine)

    def executions(
        self,
        workflow: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        search: dict[str, Any] | None = None,
    ) -> ExecutionPage:
        """One page of executions, newest first; pass ``page.cursor`` back for the next one."""
        return self.admin.executions(workflow, status, created_after, created_before, limit, cursor, search)

    def list_executions(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        started_after: datetime | float | None = None,
        started_before: datetime | float | None = None,
        search: dict[str, Any] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> ExecutionPage:
        """One page of executions, newest first, by workflow, status, start time (``started_after``
        inclusive, ``started_before`` exclusive; a datetime or epoch seconds) and search attributes
        (``{attr: value}``, AND-ed; README "Search attributes and memo"). Pass ``page.cursor`` back
        for the next page; its cost grows with what matches, not with the store."""
        return self.admin.executions(workflow, status, started_after, started_before, limit, cursor, search)

    def describe(self, workflow_id: str) -> ExecutionDetail:
        """An execution with its step timeline (malformed documents flagged, not raised)."""
        return self.admin.describe(workflow_id)

    def retry(self, workflow_id: str, *, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Re-run a failed execution from its failed step; the steps that run again. Recorded
        (``by``: who, default ``user@host``) with the steps it forgot (``describe().superseded``)."""
        return self.admin.retry(workflow_id, by=by, reason=reason)

    def terminate(self, workflow_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """End a running execution now, as failed (``WorkflowTerminated``), running nothing more
        (no compensations; its running children too); False if it had already ended. Recorded
        (``by``: who, default ``user@host``). ``cancel`` is the graceful way."""
        return terminate(self.engine, workflow_id, actor() if by is None else by, reason)

    def resume(self, workflow_id: str, *, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Drive a running execution now, or reopen a failed/cancelled one on its history (recorded)."""
        return self.admin.resume(workflow_id, by=by, reason=reason)

    def purge(
        self,
        older_than: float | timedelta,
        *,
        dry_run: bool = False,
        progress: Callable[[PurgeReport], None] | None = None,
        by: str | None = None,
        reason: str | None = None,
        matched: Callable[[ExecutionSummary], None] | None = None,
    ) -> PurgeReport:
        """Delete executions that ended more than ``older_than`` (seconds or a timedelta) ago; each
        leaves a ``purged`` record (who, when, ``reason``) that ``describe`` quotes. ``matched``
        gets each execution found to purge (with ``dry_run``: what a purge would delete now)."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
        return self.admin.purge(seconds, dry_run=dry_run, progress=progress, by=by, reason=reason, matched=matched)

    # --- the in-workflow API, also reachable as durable.<name> ---------------------------

    now = staticmethod(_wf.now)
    uuid4 = staticmethod(_wf.uuid4)
    random = staticmethod(_wf.random)
    gather = staticmethod(_wf.gather)
    execution_id = staticmethod(_wf.execution_id)
    sleep = staticmethod(_wf.sleep)
    sleep_until = staticmethod(_wf.sleep_until)
    start_timer = staticmethod(_wf.start_timer)
    wait_signal = staticmethod(_wf.wait_signal)
    continue_as_new = staticmethod(_wf.continue_as_new)
    emit = staticmethod(_wf.emit)
    Saga = _wf.Saga
