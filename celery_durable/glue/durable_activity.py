"""``@durable_activity``: a Celery task that is also a durable workflow step.

Outside a workflow the task is an ordinary Celery task (``.delay()``, direct call). Inside a
workflow, calling it records a step and schedules it (once) instead; the message carries a
``durable_step`` header (execution id, step) that tells the worker to run it as one.
Celery's own options (``autoretry_for``, ``retry_backoff``, ``max_retries``, ``time_limit`` …)
keep their meaning: the attempt loop *is* Celery's.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, overload

from celery import Task, shared_task
from celery._state import _get_active_apps, connect_on_app_finalize
from celery.app.autoretry import add_autoretry_behaviour
from celery.exceptions import Retry
from celery.local import PromiseProxy, Proxy

from celery_durable.codecs import codec_for
from celery_durable.engine.activities.attempts import may_be_stale, run_awaitable, sync_callable
from celery_durable.engine.activities.context import ActivityInterrupt, check_activity_options
from celery_durable.engine.activities.delivery import Delivery
from celery_durable.engine.documents.model import Attempt
from celery_durable.engine.drive import seals
from celery_durable.engine.limits.spec import Limit, declare_limit
from celery_durable.engine.registry import GLOBAL_ACTIVITIES, ActivityDef
from celery_durable.engine.replay.context import DurableFuture, current_context, require_context
from celery_durable.errors import ActivityError, ConfigurationError, NonRetryableError, StoreUnavailable
from celery_durable.glue.eager_activities import claimed_holder, eagerly, handed_off
from celery_durable.glue.extension import durable_of
from celery_durable.glue.session_tokens import retry_stale, use_session
from celery_durable.glue.wire import serializer
from celery_durable.observability import span
from celery_durable.retry import TaskRetry

__all__ = ["durable_activity", "ActivityTask", "DurableActivityTask", "DURABLE_HEADER", "task_retry"]

log = logging.getLogger("celery_durable.activity")

#: message header carrying the step's identity, its marker's token ``t`` (engine/activities/delivery.py) and,
#: on a re-delivery, an unrecorded outcome sealed by the library (engine/drive/seals.py)
DURABLE_HEADER = "durable_step"

P = ParamSpec("P")
R = TypeVar("R")


class DurableActivityTask(Task):  # type: ignore[misc]
    """Task base class of durable activities (mixed into stacked tasks too)."""

    abstract = True
    #: never autoretry these, whatever ``autoretry_for`` says
    dont_autoretry_for: tuple[type[BaseException], ...] = (NonRetryableError,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = current_context()
        if ctx is not None:
            # inside a workflow replay: a durable call, not an execution
            return self.start(*args, **kwargs).result()
        meta = _step_header(self.request)
        if meta is None:
            return super().__call__(*args, **kwargs)
        return _run_attempt(self, meta, args, kwargs)

    def after_return(self, *args: Any, **kwargs: Any) -> None:
        """After Celery reported an attempt that failed for good (task_failure, the ERROR line,
        the FAILURE state): drive its workflow on, its outcome recorded before (``_run_attempt``).
        A drive that fails here is the recovery scan's: the exec was left due."""
        execution_id = getattr(self.request, "durable_drive_after", None)
        if execution_id is not None:
            self.request.durable_drive_after = None
            engine = durable_of(self.app).engine
            try:
                eagerly(self, engine, execution_id, lambda: engine.driver.drive(execution_id))
            except Exception as exc:  # noqa: BLE001 - Celery's own after_return must still run
                log.warning("drive of %s after a failed activity: %s; the recovery scan drives it", execution_id, exc)
        super().after_return(*args, **kwargs)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's retry, but the step's lease is given back *before* the retry message is
        sent: otherwise the redelivery can arrive while the lease still looks held, and skip."""
        attempt = getattr(self.request, "durable_attempt", None)
        if attempt is not None:
            if not getattr(self.request, "durable_released", False):
                max_retries = kwargs.get("max_retries", self.max_retries)
                if max_retries is None or self.request.retries + 1 <= max_retries:  # a message will go
                    countdown = kwargs.get("countdown")
                    if countdown is None and kwargs.get("eta") is None:
                        countdown = self.default_retry_delay
                    # never raises for the store: the retry below must be sent in any case
                    durable_of(self.app).engine.activities.retrying(attempt, float(countdown or 0), kwargs.get("exc"))
                    self.request.durable_released = True
            # the retry may take over this attempt's lease if it could not be given back
            kwargs["headers"] = _successor_headers(self, kwargs.get("headers"), attempt)
            kwargs.setdefault("serializer", serializer(self.app))  # as its first message (glue/wire.py)
        return super().retry(*args, **kwargs)

    def start(self, *args: Any, **kwargs: Any) -> DurableFuture[Any]:
        """Inside a workflow: schedule the activity and return a future (``.result()`` waits)."""
        ctx = require_context(f"{self.name}.start()")
        definition = _definition(self)
        return ctx.call_activity(self.name, definition.codec, args, kwargs, definition.options)


def _step_header(request: Any) -> dict[str, Any] | None:
    meta = getattr(request, DURABLE_HEADER, None)
    if meta is None:
        meta = (getattr(request, "headers", None) or {}).get(DURABLE_HEADER)
    return meta if isinstance(meta, dict) else None


def _successor_headers(task: Task, headers: dict[str, Any] | None, attempt: Attempt) -> dict[str, Any]:
    """The retry message's headers: the step header names the attempt it succeeds (``h``), sealed
    (``hs``: a message naming a holder must not take a live attempt's lease; engine/drive/seals.py)."""
    request = task.request
    out = dict(headers if headers is not None else (getattr(request, "headers", None) or {}))
    meta = out.get(DURABLE_HEADER)
    if not isinstance(meta, dict):
        meta = _step_header(request) or {}
    step = (attempt.execution_id, attempt.run, attempt.seq)
    hs = seals.seal_takeover(durable_of(task.app).engine.store, step, meta.get("t"), attempt.holder)
    if hs is None:  # no key (never read, the store down): the retry waits for the lease instead
        out[DURABLE_HEADER] = {k: v for k, v in meta.items() if k not in ("h", "hs")}
        return out
    out[DURABLE_HEADER] = dict(meta, h=attempt.holder, hs=hs)
    return out


def _register(task_name: str, fn: Callable[..., Any], options: dict[str, Any] | None = None) -> ActivityDef:
    """Record the activity's definition (its codecs, from ``fn``'s hints) under its task name."""
    definition = ActivityDef(task_name, fn, codec_for(fn), dict(options or {}))
    GLOBAL_ACTIVITIES[task_name] = definition
    return definition


def _task_bound(fn: Callable[..., Any], task: Any) -> Callable[..., Any]:
    """``fn`` (a ``bind=True`` task's function) seen without its first parameter, calling the
    task's bound ``run``; its signature and resolved hints are ``fn``'s less ``self``."""
    sig = inspect.signature(fn)
    first, *rest = sig.parameters
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward refs: the codec falls back to Any as for fn itself
        hints = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        return task.run(*args, **kwargs)

    call.__signature__ = sig.replace(parameters=[sig.parameters[p] for p in rest])  # type: ignore[attr-defined]
    call.__annotations__ = {k: v for k, v in hints.items() if k != first}
    call.__name__, call.__qualname__, call.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    call.__doc__ = fn.__doc__
    return call


def _local_retry(options: dict[str, Any]) -> TaskRetry:
    """A local activity's retries from its Celery options, with Celery's defaults (what
    :func:`task_retry` reads from a task, known before the task exists)."""
    retry_kwargs = dict(options.get("retry_kwargs") or {})
    countdown = retry_kwargs.get("countdown", options.get("default_retry_delay", Task.default_retry_delay))
    return TaskRetry(
        autoretry_for=tuple(options.get("autoretry_for", ()) or ()),
        dont_autoretry_for=_with_non_retryable(options.get("dont_autoretry_for", ())),
        max_retries=retry_kwargs.get("max_retries", options.get("max_retries", Task.max_retries)),
        countdown=float(countdown),
        retry_backoff=float(options.get("retry_backoff", False) or 0),
        retry_backoff_max=float(options.get("retry_backoff_max", 600)),
    )


def _definition(task: Task) -> ActivityDef:
    definition = GLOBAL_ACTIVITIES.get(task.name)
    if definition is None:  # a task upgraded in another way: derive it from its run()
        definition = _register(task.name, getattr(task, "_orig_run", None) or task.run)
    return definition


def task_retry(task: Task) -> TaskRetry:
    """``task``'s automatic retries as a worker applies them (Celery's autoretry wrapper, then
    ``retry()``: ``retry_kwargs`` may override ``max_retries`` and the countdown)."""
    retry_kwargs = dict(getattr(task, "retry_kwargs", None) or {})
    countdown = retry_kwargs.get("countdown")
    return TaskRetry(
        autoretry_for=tuple(getattr(task, "autoretry_for", ()) or ()),
        dont_autoretry_for=_with_non_retryable(getattr(task, "dont_autoretry_for", ())),
        max_retries=retry_kwargs.get("max_retries", task.max_retries),
        countdown=float(task.default_retry_delay if countdown is None else countdown),
        retry_backoff=float(getattr(task, "retry_backoff", False) or 0),
        retry_backoff_max=float(getattr(task, "retry_backoff_max", 600)),
    )


def _countdown(exc: Retry) -> float:
    when = exc.when
    if isinstance(when, datetime):
        from datetime import UTC

        now = datetime.now(tz=when.tzinfo or UTC)
        return max(0.0, (when - now).total_seconds())
    return float(when or 0.0)


#: retries granted to keep an unrecorded outcome through a store outage (backoff up to 60 s)
OUTAGE_RETRIES = 50


def _outage_retry(task: Task, exc: Exception, headers: dict[str, Any] | None = None) -> Any:
    """Re-deliver this message later, whatever the task's own retry budget left.

    (``max_retries=None`` would mean the task's default, 3, to Celery.)
    """
    n = int(task.request.retries or 0)
    budget = (n if task.max_retries is None else int(task.max_retries)) + OUTAGE_RETRIES
    options: dict[str, Any] = {"headers": headers} if headers is not None else {}
    countdown = min(60.0, 2.0 * 2 ** min(n, 5))
    return task.retry(countdown=countdown, max_retries=n + 1 if n < budget else n, exc=exc, **options)


def _run_attempt(task: Task, meta: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    durable = durable_of(task.app)
    engine = durable.engine
    runner = engine.activities
    execution_id, seq, run = str(meta["e"]), int(meta["s"]), int(meta.get("r") or 0)
    supersedes, step = meta.get("h"), (execution_id, run, seq)
    use_session(engine.store, task.request, execution_id)
    try:
        # a header never chooses a result: only an outcome this library sealed is recorded
        outcome, forged = seals.read_step_header(engine.store, engine.emit, meta, step, task.name)
        if forged:
            return None
        delivery = Delivery.of(meta.get("t"), task.name, args, kwargs)  # which marker it is for
        claimed = claimed_holder(getattr(task.request, "id", None))  # a kept activity: its commit took the lease
        handoff = handed_off(getattr(task.request, "id", None))  # a slot freed here was granted to it
        attempt, why = runner.begin(
            execution_id, seq, run, str(supersedes) if supersedes else None, delivery, claimed, handoff
        )
    except StoreUnavailable as exc:
        if meta.get("sealed") is None:
            raise  # the step stays due: the recovery scan re-sends it
        # the outcome exists only in this message: keep it until the store answers again
        log.warning("store unavailable recording %s step %d, will retry: %s", execution_id, seq, exc)
        raise _outage_retry(task, exc) from exc
    if attempt is None:
        if may_be_stale(why) and retry_stale(task, engine.counters, why):
            return None
        log.info("activity %s (%s step %d) not run: %s", task.name, execution_id, seq, why)
        return None
    failed: BaseException | None = None  # the exception the attempt failed with for good
    if outcome is not None:
        # an earlier delivery ran the function but could not record it: record only
        doc = outcome
        doc["attempts"] = attempt.number
        if doc.get("ok") is False:
            error = doc.get("error") or {}
            failed = ActivityError(task.name, str(error.get("type")), str(error.get("message")), attempt.number)
    else:
        definition = _definition(task)
        task.request.durable_attempt = attempt  # for retry(): release before resending
        actx = runner.context(attempt, definition.options)  # activity.heartbeat() and cancels
        try:
            dargs, dkwargs = definition.codec.decode_args({"args": list(args), "kwargs": kwargs})
            log.info(
                "activity %s: %s step %d attempt %d",
                task.name,
                execution_id,
                seq,
                attempt.number,
                extra={"workflow_id": execution_id, "step": seq, "attempt": attempt.number},
            )
            with span("activity", activity=task.name, execution_id=execution_id, step=seq, attempt=attempt.number):
                with actx:  # run_awaitable: a coroutine from a task made durable some other way
                    value = run_awaitable(task.run(*dargs, **dkwargs))
            doc = runner.result_doc(attempt, value=definition.codec.encode_result(value))
        except ActivityInterrupt as exc:  # cancelled, or stalled past its heartbeat_timeout
            stalled = runner.interrupted(attempt, actx, exc)
            if stalled is None:
                return None  # nothing to record: the cancel did, or the step is not this attempt's
            delay = task_retry(task).next_delay(task.request.retries, stalled)
            if delay is not None:  # retried by its options, as any failure of the attempt
                raise task.retry(exc=stalled, countdown=delay) from None
            if definition.options.get("pause_on_failure") and runner.hold(attempt, stalled):
                raise stalled from None  # paused, the step held (engine/activities/holds.py)
            doc = runner.result_doc(attempt, error=stalled)
            failed = stalled
        except Retry as exc:
            if not getattr(task.request, "durable_released", False):  # a retry() bypassing ours
                runner.retrying(attempt, _countdown(exc), exc.exc or exc)
            raise
        except Exception as exc:  # retries exhausted or not retryable: the workflow decides
            if definition.options.get("pause_on_failure") and runner.hold(attempt, exc):
                raise  # its execution paused, the step held: re-run once unpaused (engine/activities/holds.py)
            doc = runner.result_doc(attempt, error=exc)
            failed = exc
    _record(task, attempt, doc, meta, defer=failed is not None)
    if failed is not None:
        # Recorded (never lost to what Celery does next: a result backend or an on_failure hook
        # that fails); now Celery reports it as of any task that failed for good: FAILURE with
        # the exception and its traceback, task_failure, the worker's ERROR line, Flower's Failed
        # list. Nothing runs again for it: a redelivery finds the step settled. The workflow is
        # driven on after that (after_return), so whoever waits for it sees Celery's report first.
        task.request.durable_drive_after = attempt.execution_id
        raise failed
    return None


def _record(task: Task, attempt: Any, doc: dict[str, Any], meta: dict[str, Any], defer: bool = False) -> None:
    """Record ``attempt``'s outcome and drive its workflow on, running the next activity it
    schedules here (glue/eager_activities.py); ``defer``: record only (the drive follows in
    ``after_return``). A store outage re-delivers the message with the outcome sealed into it
    (:func:`_outage_retry`, raises ``Retry``)."""
    engine = durable_of(task.app).engine
    execution_id, seq = attempt.execution_id, attempt.seq
    try:
        # a failure for good (deferred) is reported and its workflow driven before anything else
        # runs here: a step its slot is granted to is sent, not handed off behind that
        complete = lambda: engine.activities.complete(attempt, doc, defer=defer)  # noqa: E731
        eagerly(task, engine, execution_id, complete, handoffs=not defer)
    except StoreUnavailable as exc:
        # Never lose a result to a store outage: re-deliver with the outcome attached, so the
        # next try records it without running the function again.
        log.warning("store unavailable recording %s step %d, will retry: %s", execution_id, seq, exc)
        engine.leases.release(attempt)  # may fail too: the retry then takes the lease over
        task.request.durable_attempt = attempt
        task.request.durable_released = True
        step = (execution_id, attempt.run, seq)
        sealed = seals.seal_outcome(engine.store, step, meta.get("t"), doc)  # the key read at start
        if sealed is None:  # no key to seal with: the step stays due, the recovery scan re-sends it
            raise
        headers = dict(getattr(task.request, "headers", None) or {})
        headers[DURABLE_HEADER] = dict(meta, sealed=sealed)
        raise _outage_retry(task, exc, headers) from exc


class ActivityTask(Protocol[P, R]):
    """What ``@durable_activity`` returns: a Celery task whose calls are durable in workflows."""

    name: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    def start(self, *args: P.args, **kwargs: P.kwargs) -> DurableFuture[R]: ...
    def s(self, *args: Any, **kwargs: Any) -> Any: ...
    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...
    def apply_async(self, *args: Any, **kwargs: Any) -> Any: ...


class ActivityDecorator(Protocol):
    """What ``@durable_activity(...)`` with options returns: an ``async def`` activity is
    called (in a workflow and outside) for its awaited result."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> ActivityTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> ActivityTask[P, R]: ...


class BoundActivityDecorator(Protocol):
    """What ``@durable_activity(bind=True, ...)`` returns: the task is the first parameter
    (``self``, as Celery binds it), not an argument of the call."""

    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> ActivityTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R]) -> ActivityTask[P, R]: ...


@overload
def durable_activity(fn: Callable[P, Coroutine[Any, Any, R]]) -> ActivityTask[P, R]: ...
@overload
def durable_activity(fn: Callable[P, R]) -> ActivityTask[P, R]: ...
@overload
def durable_activity(*, name: str | None = None, bind: Literal[True], **options: Any) -> BoundActivityDecorator: ...
@overload
def durable_activity(*, name: str | None = None, **options: Any) -> ActivityDecorator: ...
def durable_activity(fn: Any = None, *, name: str | None = None, **options: Any) -> Any:
    """Declare a durable activity.

    On a plain function it creates a Celery shared task (``options`` are Celery task
    options). ``local=True`` makes it a *local* activity: inside a workflow the drive runs it in
    its own process, without a broker round trip, and records its result with the drive's commit
    (retried by the same options; see README "Local activities"). Stacked on ``@app.task`` or
    ``@shared_task`` it upgrades that task in place (``@durable_activity`` goes on top). An
    ``async def`` function runs to completion with ``asyncio.run`` wherever the task runs.
    """

    local = bool(options.pop("local", False))
    keys = ("heartbeat_timeout", "cancellation", "pause_on_failure")
    given: dict[str, Any] = {k: options.pop(k) for k in keys if k in options}
    beats = check_activity_options(given)
    limit = options.pop("limit", None)
    if limit is not None:
        if not isinstance(limit, Limit):
            raise ConfigurationError(f"@durable_activity(limit=) takes a celery_durable.Limit, not {limit!r}")
        if local:
            raise ConfigurationError(
                "@durable_activity(local=True) cannot take limit=: a local activity runs inside the drive, "
                "which cannot wait for a slot; use a normal activity"
            )
        declare_limit(limit)
        given["limit"] = limit
        beats["limit"] = limit
    if local and given:
        raise ConfigurationError(
            f"@durable_activity(local=True) cannot take {', '.join(given)}: a local activity runs inside the "
            "drive, which no heartbeat watches; use a normal activity for long work"
        )
    limits = [o for o in ("time_limit", "soft_time_limit") if local and options.get(o) is not None]
    if limits:
        raise ConfigurationError(
            f"@durable_activity(local=True) cannot take {', '.join(limits)}: a local activity runs inside the "
            "drive, where no Celery time limit stops it; use a normal activity for work that needs one"
        )

    def wrap(target: Any) -> Any:
        if local and (issubclass(type(target), Proxy) or isinstance(target, Task)):
            raise ConfigurationError(
                "@durable_activity(local=True) goes on a plain function (its retry options with it), "
                f"not on a Celery task: {target!r}"
            )
        # type(), not isinstance(): a proxy claims its target's class, and asking evaluates it
        if given and (issubclass(type(target), Proxy) or isinstance(target, Task)):
            raise ConfigurationError(
                f"@durable_activity({', '.join(given)}=…) goes on a plain function; on a Celery task give "
                f"them to the task: @app.task({', '.join(given)}=…) under @durable_activity"
            )
        if issubclass(type(target), Proxy):
            return _upgrade_proxy(target)
        if isinstance(target, Task):
            return _upgrade(target)
        task_name = name or f"{target.__module__}.{target.__qualname__}"
        run = sync_callable(target)
        if "dont_autoretry_for" in options:  # Celery takes the option over the class attribute
            options["dont_autoretry_for"] = _with_non_retryable(options["dont_autoretry_for"])
        task = shared_task(name=task_name, base=DurableActivityTask, **options)(run)
        # bind=True: Celery passes the task as the first parameter; the call's arguments (what
        # the codec checks and a workflow passes) are the rest
        # local: steps run in the drive's process (engine/activities/local_activities.py), with these retries
        local_options = {"local": _local_retry(options)} if local else beats
        _register(task_name, _task_bound(run, task) if options.get("bind") else run, local_options)
        return task

    return wrap(fn) if fn is not None else wrap


def _with_non_retryable(classes: Any) -> tuple[type[BaseException], ...]:
    dont = tuple(classes or ())
    return dont if NonRetryableError in dont else (*dont, NonRetryableError)


def _upgrade(task: Task) -> Task:
    """Make ``task`` (a real task object, not a proxy) a durable activity, in place."""
    cls = type(task)
    if not issubclass(cls, DurableActivityTask):
        dont = _with_non_retryable(getattr(task, "dont_autoretry_for", ()))
        task.__class__ = type(cls.__name__, (DurableActivityTask, cls), {"dont_autoretry_for": dont})
        # Celery's autoretry wrapper was built with the task's options of then (its
        # dont_autoretry_for lacked NonRetryableError) around the function as it was (maybe
        # async): rebuild it around the synchronous function, with the options of now.
        orig = task.__dict__.pop("_orig_run", None)
        if orig is not None:
            task.__dict__.pop("run", None)
        fn = orig if orig is not None else task.run
        if inspect.iscoroutinefunction(fn):
            task.run = sync_callable(fn)
        if orig is not None or inspect.iscoroutinefunction(fn):
            add_autoretry_behaviour(task)
    # a task's own heartbeat_timeout / cancellation (Celery keeps unknown options as attributes)
    keys = ("heartbeat_timeout", "cancellation", "pause_on_failure")
    given = {k: getattr(task, k) for k in keys if getattr(task, k, None) is not None}
    options = check_activity_options(given)
    limit = getattr(task, "limit", None)  # @app.task(limit=Limit(...)) under @durable_activity
    if isinstance(limit, Limit):
        options["limit"] = declare_limit(limit)
    _register(task.name, getattr(task, "_orig_run", None) or task.run, options)
    return task


def _shared_origin(proxy: Proxy) -> tuple[Callable[..., Any], str | None] | None:
    """The function and explicit name behind ``@shared_task``'s proxy, without evaluating it.

    Evaluating it would finalize the current app at import time (Celery does that on first
    use only). Read from the proxy's closure; ``None`` if this Celery builds it otherwise.
    """
    try:
        local = object.__getattribute__(proxy, "_Proxy__local")
        cells = dict(zip(local.__code__.co_freevars, local.__closure__ or (), strict=True))
        fun = cells["fun"].cell_contents
        name = cells["name"].cell_contents
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return (fun, name) if callable(fun) and (name is None or isinstance(name, str)) else None


def _upgrade_proxy(proxy: Proxy) -> Proxy:
    """``@shared_task`` (a lazy proxy) or ``@app.task`` on an unfinalized app (a promise)."""
    if issubclass(type(proxy), PromiseProxy):  # one app's task, created when the promise is evaluated
        proxy.__then__(lambda: _upgrade(proxy._get_current_object()))
        return proxy
    origin = _shared_origin(proxy)
    if origin is None:  # unknown proxy layout: resolve it now, in the current app
        task_name = proxy.name

        def find(app: Any) -> Task | None:
            return app._tasks.get(task_name)
    else:
        fun, explicit = origin

        def find(app: Any) -> Task | None:
            return app._tasks.get(explicit or app.gen_task_name(fun.__name__, fun.__module__))

        if explicit is not None:  # known now: the environment finds it before any app exists
            _register(explicit, sync_callable(fun))

    def on_finalize(app: Any) -> None:
        task = find(app)
        if task is not None:
            _upgrade(task)
        else:  # finalizers run in no set order: shared_task's may come after this one
            app.on_after_finalize.connect(lambda **_: _upgrade_in(app), weak=False)

    def _upgrade_in(app: Any) -> None:
        task = find(app)
        if task is not None:
            _upgrade(task)

    connect_on_app_finalize(on_finalize)
    for app in _get_active_apps():
        if app.finalized:
            _upgrade_in(app)
    return proxy
