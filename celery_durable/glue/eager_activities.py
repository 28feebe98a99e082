"""Eager activities: the worker that finishes an activity runs the workflow's next one itself.

With ``durable_eager_activities`` = N > 0, a delivery (of an activity, a drive message or a
timer) whose drive schedules activities keeps the first one it can run here instead of sending
its message, runs it right after, and so on, up to N in a row. Like Temporal's eager activity execution: the
steps of a sequential workflow cost no broker round trip (a publish, the consumer, the pool's
pipe) and their drives land in the process that holds the workflow's live instance
(engine/replay/sticky.py).

A kept activity runs through Celery's own tracer (``celery.app.trace.trace_task``) with the
request a delivery would have (its task id, the step header, its routing and priority, the
task whose commit kept it as ``parent_id``), so its
signals, ``autoretry_for``, ``retry()`` (which sends a real message) and logging behave as for a
delivered one, and its attempt takes the step's lease as usual: a worker killed mid-attempt is
recovered as any attempt is. What Celery cannot do for it is shown in README ("Eager
activities"): it is not a separate task in Flower, and the pool's time limits cover one message,
so an activity is kept only when

- this process received the delivery from a broker (not ``apply()``, not a test environment),
- its task is registered here and routed to the queue this delivery came from,
- no time limit applies to either task (message, task options, worker configuration or its
  command line), and no rate limit to the kept one (the consumer enforces those, and never
  sees an eager run),
- it is sent by the commit of its own execution (not by code the delivery runs: an activity
  starting a workflow with eager start would wait for itself),
- the worker is not shutting down (known in the worker's own process only: a prefork pool
  child runs the rest of its budget).

The same delivery also runs, when nothing of its own workflow is kept, the step a limit's slot
was just handed to by an attempt that ended here (``ActivityRequest.handoff``,
engine/limits/slots.py): the process the slot freed on starts its next holder, with no broker
round trip (a waiting step is not queued behind the worker's other messages). Hand-offs are not
counted in ``durable_eager_activities``; a delivery takes them for :data:`HANDOFF_SECONDS`, then
sends them. No lease is taken for a kept hand-off: a process killed before it starts leaves the
grant to the limit's recovery scan (a granted step that never began is sent again).

Anything else is sent as usual. A kept activity that is not run (the delivery raised after the
commit, the worker began to stop) is sent at the end of the delivery, so it is never left
without a message; a process killed between the commit and its start leaves the step to the
recovery scan's re-send after ``durable_activity_queue_timeout``.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from celery import Celery
from celery._state import get_current_task
from celery.app.task import Context
from celery.app.trace import trace_task
from celery.signals import task_revoked
from celery.utils.saferepr import saferepr

from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.glue import pool_board
from celery_durable.glue.eager_events import events_on, send_event, send_traced
from celery_durable.glue.extension import durable_of
from celery_durable.glue.pools import time_limit

__all__ = [
    "ActivitySender",
    "Drain",
    "Kept",
    "committing",
    "draining",
    "claimed_holder",
    "eagerly",
    "give_back",
    "handed_off",
    "keep",
    "keeps",
    "run_kept",
]

log = logging.getLogger("celery_durable.activity")

#: for how long after its start a delivery runs the steps its ended attempts handed a slot to
HANDOFF_SECONDS = 60.0

T = TypeVar("T")


@runtime_checkable
class ActivitySender(Protocol):
    """What sends activities in a worker (``tasks.CeleryDispatcher``)."""

    def publish_activity(self, request: ActivityRequest) -> None: ...
    def activity_options(self, request: ActivityRequest) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Kept:
    """An activity a delivery kept: committed and not sent."""

    request: ActivityRequest
    #: its message's options (``ActivitySender.activity_options``: id, headers, shadow …)
    options: dict[str, Any]
    #: the run whose commit kept it (its ``parent_id``)
    parent_id: str | None
    #: its message's priority (None: the delivery's)
    priority: int | None


@dataclass
class Drain:
    """One broker delivery's run of eager activities."""

    app: Celery
    #: the task of the delivery (its request is hidden while the kept ones run)
    task: Any
    sender: ActivitySender
    #: activities it may still run after its own
    budget: int
    #: the queue (routing key) the delivery came from, and the routing of the kept ones
    queue: str
    delivery_info: dict[str, Any]
    hostname: str | None
    root_id: str | None
    #: the activity it kept, to run next
    pending: Kept | None = None
    #: the route :func:`keeps` found before the commit, for :func:`keep` after it
    offered: Kept | None = None
    #: a step a slot was handed to here (``ActivityRequest.handoff``), run when nothing is pending
    handoff: Kept | None = None
    #: until when (``time.monotonic()``) it takes hand-offs
    handoffs_until: float = 0.0


_DRAIN: contextvars.ContextVar[Drain | None] = contextvars.ContextVar("celery_durable_eager_drain", default=None)
#: the kept activity running now in this context (its lease holder, or its hand-off's grant)
_RUNNING: contextvars.ContextVar[ActivityRequest | None] = contextvars.ContextVar(
    "celery_durable_eager_running", default=None
)
#: the execution whose commit runs now in this context: only its own sends are kept (what a
#: local activity or an activity's own code sends, e.g. an eager start, goes out as usual)
_COMMITTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("celery_durable_eager_commit", default=None)


def _rate_limited(task: Any, app: Celery) -> bool:
    """Whether the worker's consumer would hold the task's messages to a rate (``rate_limit``):
    it never sees an eager run, so such a task is always sent."""
    if app.conf.get("worker_disable_rate_limits"):
        return False
    board = pool_board.board()
    set_at_run_time = board.rate_limited(task.name) if board is not None else None
    if set_at_run_time is not None:  # celery control rate_limit (a prefork child's task never learns it)
        return set_at_run_time
    return bool(getattr(task, "rate_limit", None) or app.conf.get("task_default_rate_limit"))


def _stopping() -> bool:
    """A warm or cold shutdown has begun: in this process (Celery sets the exit code there, 0
    included) or, for a prefork pool child, in the worker's main process (glue/pool_board.py)."""
    from celery.worker import state

    board = pool_board.board()
    if board is not None and board.stopping:
        return True
    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


def _revoked(task_id: str) -> bool:
    """``revoke(task_id)`` reached this worker: its main process's revoked set (this process's
    own in a threads or solo worker), as Celery looks a delivered message up."""
    from celery.worker import state

    board = pool_board.board()
    return (board is not None and board.revoked(task_id)) or task_id in state.revoked


@contextmanager
def draining(task: Any, budget: int, sender: ActivitySender | None, handoffs: bool = True) -> Iterator[Drain | None]:
    """Around a broker delivery's commit and what follows it: keep the next activity the
    commit schedules (:func:`keep`); the caller runs it with :func:`run_kept`. ``None`` (nothing
    kept) when eager activities are off, this is itself an eager run (the outer delivery's
    drain runs the next), or this delivery could not run one as Celery would. Whatever is kept
    and not run is sent (``sender``) on the way out."""
    request = getattr(task, "request", None)
    info = dict(getattr(request, "delivery_info", None) or {})
    queue = info.get("routing_key")
    if (
        budget <= 0
        or sender is None
        or _DRAIN.get() is not None
        or not queue
        or getattr(request, "is_eager", False)
        or getattr(request, "called_directly", True)
        or time_limit(task, task.app, request) is not None
    ):
        yield None
        return
    drain = Drain(
        app=task.app,
        task=task,
        sender=sender,
        budget=budget,
        queue=str(queue),
        delivery_info={k: info[k] for k in ("exchange", "routing_key", "priority") if k in info},
        hostname=getattr(request, "hostname", None),
        root_id=getattr(request, "root_id", None) or getattr(request, "id", None),
        handoffs_until=time.monotonic() + HANDOFF_SECONDS if handoffs else 0.0,
    )
    token = _DRAIN.set(drain)
    try:
        yield drain
    finally:
        _DRAIN.reset(token)
        left, drain.pending = drain.pending, None
        if left is not None:  # committed and not run: its lease back first, then its message
            give_back(drain.app, left.request)
            drain.sender.publish_activity(left.request)
        handed, drain.handoff = drain.handoff, None
        if handed is not None:  # granted and not run (no lease was taken for it): its message
            drain.sender.publish_activity(handed.request)


@contextmanager
def committing(execution_id: str) -> Iterator[None]:
    """Around the commit of a drive of ``execution_id``: the sends :func:`keep` may take."""
    token = _COMMITTING.set(execution_id)
    try:
        yield
    finally:
        _COMMITTING.reset(token)


def keeps(request: ActivityRequest) -> bool:
    """The driver's question before its commit (``Dispatcher.keeps``): would the current
    delivery keep ``request`` to run next? Then the commit takes its first attempt's lease."""
    kept = _route(request)
    drain = _DRAIN.get()
    if drain is not None:
        drain.offered = kept
    return kept is not None


def _route(request: ActivityRequest, handoff: bool = False) -> Kept | None:
    """``request`` as the current delivery would keep it, or None: it must be sent. A
    ``handoff`` (a slot granted here, not the commit's own send) has its own place and time."""
    drain = _DRAIN.get()
    if drain is None:
        return None
    if handoff:
        if drain.handoff is not None or time.monotonic() > drain.handoffs_until:
            return None
    elif drain.pending is not None or drain.budget <= 0 or _COMMITTING.get() != request.execution_id:
        return None  # not the commit's own send: user code the delivery runs (an eager start)
    task = drain.app.tasks.get(request.name)
    if task is None or _rate_limited(task, drain.app) or _stopping():
        return None
    offered = None
    if not handoff:
        offered, drain.offered = drain.offered, None
    if offered is not None and offered.request.task_id == request.task_id:
        # routed by keeps() before this commit: the same task, options and parent (the
        # checks above may have changed since: a shutdown, a rate limit set meanwhile)
        return dc_replace(offered, request=request)
    if time_limit(task, drain.app) is not None:
        return None
    try:
        # as apply_async routes it: the task's own options (queue=...), the send's, task_routes
        sent = drain.sender.activity_options(request)
        options = {**getattr(task, "_get_exec_options", dict)(), **sent}
        route = drain.app.amqp.router.route(options, request.name, request.args, request.kwargs, task_type=task)
    except Exception:  # a router of the user's that fails here fails the send too: let it
        return None
    queue = route.get("queue")
    if queue is None and route.get("exchange") is None:  # a route without a queue: the default one
        queue = drain.app.conf.get("task_default_queue")
    if getattr(queue, "name", queue) != drain.queue:
        return None
    parent = getattr(get_current_task(), "request", None)
    # the priority its message would have had (a retry() of it is sent with it): the route's or
    # the task's, else the parent's if inherited, else the worker's default; none at all: the
    # delivery's (a transport's default, as on the message)
    priority = route.get("priority", options.get("priority"))
    if priority is None and drain.app.conf.get("task_inherit_parent_priority"):
        priority = (getattr(parent, "delivery_info", None) or {}).get("priority")
    if priority is None:
        priority = drain.app.conf.get("task_default_priority")
    return Kept(request, sent, getattr(parent, "id", None), priority)


def keep(request: ActivityRequest) -> bool:
    """The dispatcher's question before it sends an activity: ``True`` if the current delivery
    keeps it to run next (then it must not be sent). Only an activity whose first attempt's
    lease its commit took (``request.holder``: :func:`keeps` said yes before the commit): a
    process killed before it starts is then recovered when that lease lapses; or a step a slot
    was just handed to here (``request.handoff``), recovered by its limit's scan."""
    if request.holder is None and request.handoff is None:
        return False
    kept = _route(request, handoff=request.holder is None)
    drain = _DRAIN.get()
    if kept is None or drain is None:
        return False
    if request.holder is None:
        drain.handoff = kept
    else:
        drain.pending = kept
    return True


def run_kept(drain: Drain) -> None:
    """Run the kept activities one after another (each may keep the next) while the budget
    lasts, then the hand-offs; what is left when it ends is sent by :func:`draining`."""
    # hide the delivery's request: the kept code calling the delivery's task as a plain function
    # must not look like another delivery of its step (DurableActivityTask.__call__); an empty
    # one (Task.push_request copies the request below it)
    drain.task.request_stack.push(Context())
    try:
        while not _stopping():
            if drain.pending is not None and drain.handoff is not None:
                # its own workflow's next step runs here: the hand-off must not wait behind it
                handed, drain.handoff = drain.handoff, None
                drain.sender.publish_activity(handed.request)
            if drain.pending is not None:  # kept only while the budget lasts
                kept, drain.pending = drain.pending, None
                drain.budget -= 1
            elif drain.handoff is not None:
                kept, drain.handoff = drain.handoff, None
            else:
                break
            request, options = kept.request, kept.options
            task = drain.app.tasks[request.name]
            headers = dict(options["headers"])
            context = {
                "id": request.task_id,
                "task": request.name,
                "shadow": options.get("shadow"),
                "headers": headers,
                **headers,  # a delivered message's headers are attributes of its request too
                "delivery_info": dict(drain.delivery_info, redelivered=False)
                | ({} if kept.priority is None else {"priority": kept.priority}),
                "hostname": drain.hostname,
                "root_id": drain.root_id,
                "parent_id": kept.parent_id,
                "correlation_id": request.task_id,
                "retries": 0,
                "timelimit": (None, None),
                "is_eager": False,
                "ignore_result": True,
            }
            args, kwargs = list(request.args), dict(request.kwargs)
            events = drain.hostname, task
            if _revoked(request.task_id):
                # as the worker discards a revoked message: no task-received, the task_revoked
                # signal and event, not run; the step is left to recovery
                log.info("Discarding revoked task: %s[%s]", request.name, request.task_id)
                task_revoked.send(sender=task, request=Context(context), terminated=False, signum=None, expired=False)
                send_event(events, "task-revoked", uuid=request.task_id, terminated=False, signum=None, expired=False)
                continue
            if events_on(events):  # saferepr only for an event that is sent
                send_event(
                    events,
                    "task-received",
                    uuid=request.task_id,
                    name=options.get("shadow") or request.name,  # as a delivered request names itself
                    args=saferepr(args),
                    kwargs=saferepr(kwargs),
                    root_id=drain.root_id,
                    parent_id=kept.parent_id,
                    retries=0,
                    eta=None,
                    expires=None,
                )
            log.info("activity %s (%s step %d): run here, not sent", request.name, request.execution_id, request.seq)
            send_event(events, "task-started", uuid=request.task_id)
            # the tracer catches what the task raises (as for a delivery: logged, signalled, a
            # Retry already sent its message); the next kept activity, if any, is its drive's
            board = pool_board.board()
            running = _RUNNING.set(request)
            try:
                with board.running(request.task_id) if board is not None else nullcontext():
                    traced = trace_task(task, request.task_id, args, kwargs, context, app=drain.app, eager=False)
            finally:
                _RUNNING.reset(running)
            send_traced(events, request.task_id, traced)
    finally:
        drain.task.request_stack.pop()


def give_back(app: Celery, request: ActivityRequest) -> None:
    """The lease ``request``'s commit claimed, given back before its message is sent instead
    (``ActivityRunner.unclaim``); a failure is logged: recovery re-sends it once the lease lapses."""
    try:
        durable_of(app).engine.activities.unclaim(request)
    except Exception as exc:  # noqa: BLE001 - the message goes all the same
        log.warning("could not give back the lease of kept activity %s: %s", request.task_id, exc)


def claimed_holder(task_id: str | None) -> str | None:
    """The lease holder the commit that kept ``task_id`` took for it, while this process runs
    it as a kept activity (never read from a message: a header cannot claim a lease)."""
    running = _RUNNING.get()
    return running.holder if running is not None and running.task_id == task_id else None


def handed_off(task_id: str | None) -> tuple[str, int, str | None] | None:
    """The grant (limit partition, attempt number, marker token) of ``task_id`` if this process
    runs it now as a hand-off: the slot was freed here and no read checked it may still run (its
    begin gives the slot back if it may not)."""
    running = _RUNNING.get()
    return running.grant() if running is not None and running.task_id == task_id else None


_SENDERS: dict[type, bool] = {}


def _is_sender(cls: type) -> bool:
    """``isinstance(…, ActivitySender)`` by class, once per class: a runtime-checkable protocol's
    check walks its members every time, and this runs for every delivery and kept run."""
    known = _SENDERS.get(cls)
    if known is None:
        known = _SENDERS[cls] = issubclass(cls, ActivitySender)
    return known


def eagerly(task: Any, engine: Any, execution_id: str, commit: Callable[[], T], handoffs: bool = True) -> T:
    """``commit()`` (a delivery's drive of ``execution_id``: an activity's, a drive message's, a
    timer's), then the activities it kept, if ``engine`` sends through a worker's dispatcher
    (:class:`ActivitySender`) with ``durable_eager_activities`` on. ``handoffs=False``: a step
    granted a slot this commit frees is sent, not run here (the delivery has more to do first:
    report its failure, drive its workflow)."""
    sender = engine.dispatcher if _is_sender(type(engine.dispatcher)) else None
    with draining(task, engine.settings.eager_activities, sender, handoffs) as drain:
        with committing(execution_id):
            outcome = commit()
        if drain is not None:
            run_kept(drain)
    return outcome
