"""The engine: one object tying a store, a dispatcher and the registries together.

No Celery import here (docs/architecture.md §3): the Celery glue builds an :class:`Engine` with a
dispatcher made of Celery tasks; unit tests build one with :class:`InlineDispatcher` and the
in-memory store.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from celery_durable.engine.activities.attempts import ActivityRunner
from celery_durable.engine.activities.lease_heartbeat import Heartbeat
from celery_durable.engine.activities.leases import LeaseKeeper
from celery_durable.engine.admin.child_ops import resume_child
from celery_durable.engine.admin.oplog import cancel_ops
from celery_durable.engine.admin.pending_ops import check_field, check_signal_name
from celery_durable.engine.children.links import Children
from celery_durable.engine.dispatcher import (
    ActivityRequest,
    AdmitRequest,
    ChildRequest,
    ClockRequest,
    Dispatcher,
    Send,
    SignalRequest,
)
from celery_durable.engine.documents.checks import check_workflow_id
from celery_durable.engine.documents.model import (
    DUE_EXEC,
    EXEC_ID,
    Clock,
    Settings,
    SystemClock,
    create_exec,
    new_exec_doc,
    worker_identity,
)
from celery_durable.engine.documents.records import ExecDoc, as_exec, count_of, is_terminal
from celery_durable.engine.documents.schema import CANCELLED_BY_PARENT, NOT_STARTED, Status
from celery_durable.engine.documents.search import start_fields
from celery_durable.engine.drive.driver import Driver
from celery_durable.engine.drive.partition_cache import PartitionCache
from celery_durable.engine.drive.recovery import Recovery
from celery_durable.engine.drive.upkeep import wake
from celery_durable.engine.limits.slots import Slots
from celery_durable.engine.limits.spec import WorkflowQueueing, workflow_limit
from celery_durable.engine.outbox import DUE_ADMIT, OutboxEngine, OutboxSettings
from celery_durable.engine.outbox.runtime import EffectKeeper
from celery_durable.engine.outcomes import ClockOutcome, DriveOutcome
from celery_durable.engine.registry import Registry, WorkflowDef
from celery_durable.engine.signals.inbox import Signals
from celery_durable.engine.signals.updates import Updates
from celery_durable.engine.starts.deadlines import Timing, cancel_scheduled, exec_fields
from celery_durable.engine.starts.debounce import push_back
from celery_durable.engine.starts.dedup import OnConflict, claim
from celery_durable.engine.timers.clocks import Timers
from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    DurableError,
    LaneFull,
    OperationRefused,
    StoreError,
    UnknownWorkflowError,
)
from celery_durable.observability import Counters, tracing_configured
from celery_durable.stores.base import Doc, Store, strip_reserved
from celery_durable.stores.offload.store import offloaded
from celery_durable.stores.push.base import NoPush, Notifier, wait_for

__all__ = ["Engine"]

log = logging.getLogger("celery_durable.engine")

Listener = Callable[..., None]

#: the events of an execution's terminal commit: waiters are told (Notifier.publish)
_ENDED = frozenset({"workflow_completed", "workflow_failed", "workflow_cancelled", "workflow_timed_out"})


class Engine:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        registry: Registry | None = None,
        settings: Settings | None = None,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings or Settings()
        #: wakes handle.result() when an execution ends (stores/push/base.py); polling without one
        self.notifier: Notifier = notifier or NoPush()
        self.clock: Clock = clock or SystemClock()
        # documents past the item limit go to chunk documents, up to durable_max_payload (due
        # for the orphan chunk collector on this clock: recovery scans on it)
        store = offloaded(store, self.settings.max_payload, clock=self.clock.now)
        if tracing_configured():  # every store call becomes a span (with Cosmos' request charge)
            from celery_durable.stores.traced import TracedStore

            store = TracedStore(store)
        self.store = store
        self.dispatcher = dispatcher
        self.registry = registry or Registry()
        self.cache = PartitionCache(store)
        self.driver = Driver(self)
        self.activities = ActivityRunner(self)
        #: the one heartbeat thread of this process: activity leases and effect handlers
        # idling at the renewal interval, it never needs waking for a newly tracked attempt
        self.heartbeat = Heartbeat(idle_check=self.settings.heartbeat_interval)
        self.leases = LeaseKeeper(self, self.heartbeat)
        #: keyed concurrency and rate limits' slots (engine/limits/)
        self.limits = Slots(self)
        self.recovery = Recovery(self)
        self.timers = Timers(self)
        self.signals = Signals(self)
        self.updates = Updates(self)  # workflow updates, the caller's side (engine/signals/updates.py)
        self.children = Children(self)
        #: the effect outbox, owned here so that ``wf.emit`` is admitted by the drive that recorded
        #: it, wherever the engine runs (workers, ``WorkflowEnvironment``)
        outbox_settings = OutboxSettings.of(self.settings)
        self.outbox = OutboxEngine(store, dispatcher, outbox_settings, self.clock, events=self.emit)
        #: effect handlers running in this process, beating on the same heartbeat
        self.effect_keeper = EffectKeeper(
            min(outbox_settings.cancel_poll, outbox_settings.heartbeat_interval), self.heartbeat
        )
        self._listeners: list[Listener] = []
        self.counters = Counters()
        self._listeners.append(self.counters.on_event)
        self._listeners.append(self._publish_end)
        #: who this engine is when it holds an exec lease (per process; the simulation gives
        #: each simulated worker its own)
        self.identity: Callable[[], str] = worker_identity

    # --- events (the Celery glue forwards them to celery_durable.glue.hooks) -----------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _publish_end(self, event: str, **kwargs: Any) -> None:
        # emitted after the commit that ended the execution (driver: _after_commit, fail_corrupt)
        if event in _ENDED or event == "update_settled":  # an update's caller waits too
            self.notifier.publish(str(kwargs["execution_id"]))

    def emit(self, event: str, **kwargs: Any) -> None:
        for listener in self._listeners:
            try:
                listener(event, **kwargs)
            except Exception:  # a broken receiver must never break a drive
                log.exception("listener for %s failed", event)

    # --- client side --------------------------------------------------------------------

    def start(
        self,
        workflow: WorkflowDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        workflow_id: str | None = None,
        parent: dict[str, Any] | None = None,
        search: dict[str, Any] | None = None,
        memo: Any = None,
        dedup: tuple[str, OnConflict] | None = None,
        timing: Timing | None = None,
        queueing: WorkflowQueueing | None = None,
        first: tuple[list[Doc], dict[str, Any]] | None = None,
    ) -> tuple[str, bool]:
        """Create the execution (idempotent by id) and send its first drive.

        ``first``: documents created in the batch that creates it and exec fields (a signal value
        or an update request and its count: engine/starts/with_start.py).

        The id and the payload are validated here, in the caller, before anything is stored or
        sent (:class:`InvalidWorkflowId`, see :func:`check_workflow_id`); ``None`` draws a random id.
        Returns ``(execution_id, created)``; ``created`` is False when the id existed (joined).
        ``search`` (indexed attributes) and ``memo`` (any JSON) are checked here too
        (:class:`InvalidSearchAttribute`; engine/documents/search.py) and stored in the exec document.
        ``timing``: its deadline and start delay, checked by the caller (engine/starts/deadlines.py).
        ``queueing``: the limit it waits on, if not its workflow's (engine/limits/workflows.py).
        """
        eid = uuid.uuid4().hex if workflow_id is None else check_workflow_id(workflow_id)
        extra = start_fields(search, memo)
        payload = workflow.codec.encode_args(args, kwargs)
        group = "" if parent is None else str(parent.get("pk"))  # a child's turns are its parent's
        limit = workflow_limit(workflow.limit, queueing, args, kwargs, group, self.clock.now())
        if limit is not None:
            extra["limit"] = limit
        eager = self.settings.eager_start and parent is None and (timing is None or not timing.start_delay)
        eager = eager and limit is None and first is None  # a limited one starts when it gets its slot
        extra.update(first[1] if first is not None else {})
        if dedup is not None:  # one running execution per key (engine/starts/dedup.py)
            extra["dedup_key"] = dedup[0]

        def joinable(existing: Doc | None) -> bool:
            """Whether ``existing`` (the exec of ``eid``, if any) is one to join; another
            workflow's is refused (:class:`ConfigurationError`)."""
            if existing is not None and existing.get("workflow") != workflow.name:
                raise ConfigurationError(
                    f"execution {eid!r} exists and runs workflow {existing.get('workflow')!r}, not {workflow.name!r}"
                )
            return existing is not None

        def create() -> bool:
            extra["first"] = first[0] if first is not None else ()  # by keyword, as eager and timing
            if self.create_execution(workflow.name, payload, eid, parent, eager=eager, timing=timing, **extra):
                return True
            joinable(self.store.read(eid, EXEC_ID))
            return False

        # with a key, an id that exists is joined (or refused) as without one, before any claim:
        # a refused or joined start takes no key and cancels no holder
        quiet = timing.start_delay if dedup is not None and timing is not None and timing.debounce else None

        def reschedule(owner: str) -> bool:  # a debounced start: the scheduled holder takes our input
            now, record = self.clock.now(), extra.get("limit")
            return quiet is not None and push_back(self.store, now, owner, workflow.name, payload, quiet, record)

        if dedup is not None and workflow_id is not None and joinable(self.store.read(eid, EXEC_ID)):
            reschedule(eid)  # joined, and (debounced, still scheduled) given this input
            return eid, False
        if dedup is not None:
            return claim(self, dedup[0], dedup[1], eid, workflow.name, create, reschedule if quiet else None)
        return eid, create()

    def create_execution(
        self,
        workflow: str,
        payload: dict[str, Any],
        eid: str,
        parent: dict[str, Any] | None,
        eager: bool = False,
        timing: Timing | None = None,
        deadline_at: float | None = None,
        first: Sequence[Doc] = (),
        **fields: Any,
    ) -> bool:
        """Create-only: False when ``eid`` exists. Sends the first drive when created. ``fields``
        join the exec document (``search``, ``memo``).

        ``eager``: drive the first step here instead (``durable_eager_start``); a drive that would
        do more than schedule activities or timers declines, and the first drive goes as usual.
        ``timing``, ``deadline_at`` (a parent's deadline, for a child): its clocks, created with it
        (engine/starts/deadlines.py); a delayed one is created ``scheduled`` and not driven.
        """
        now = self.clock.now()
        definition = self.registry.workflow(workflow)
        timed, clocks = exec_fields(eid, timing, deadline_at, now)
        # if the first drive message is lost, recovery drives it after drive_timeout
        doc = new_exec_doc(
            eid,
            workflow,
            payload,
            parent,
            definition.signal_names if definition is not None else None,
            now,
            **({"due_kind": DUE_EXEC, "due_at": now + self.settings.drive_timeout} | fields | timed),
        )
        if isinstance(fields.get("limit"), dict) and "status" not in timed:
            doc.update(status=Status.QUEUED.value, queued_at=now)  # it starts when it gets a slot
        known = create_exec(self.store, doc, [*clocks, *first])  # first: engine/starts/with_start.py
        if known is None:
            return False
        self.emit("workflow_started", execution_id=eid, workflow=workflow)
        if timed.get("status") == Status.SCHEDULED:
            return True  # its start clock sends the first drive
        if doc.get("status") == Status.QUEUED:
            self.limits.queue_execution(eid, fields["limit"])
            return True
        if not (eager and definition is not None and self._eager_drive(eid, known)):
            self.dispatcher.send_drive(eid)
        return True

    def _eager_drive(self, eid: str, created: dict[str, Doc]) -> bool:
        """The first drive in the caller; False when a worker must drive it (declined, failed).

        Any failure here only costs the usual drive message: the execution exists and is due, a
        drive that committed leaves the worker's drive nothing to do.
        """
        try:
            return self.driver.drive(eid, eager=True, known=created) == DriveOutcome.SUSPENDED
        except Exception as exc:  # a store or broker error: the worker's drive retries it
            log.warning("eager start of %s: %s; a worker drives it", eid, exc)
            return False
        except KeyboardInterrupt:  # the caller's: it goes on, and a worker drives at once
            try:
                self.dispatcher.send_drive(eid)
            except Exception:  # recovery drives it after drive_timeout; the interrupt still goes on
                log.warning("eager start of %s interrupted; sending its drive failed", eid, exc_info=True)
            raise
        except BaseException as exc:  # workflow code's (sys.exit() in it): a worker's to record
            log.warning("eager start of %s: workflow code raised %r; a worker drives it", eid, exc)
            return False

    def read_exec(self, execution_id: str) -> ExecDoc:
        doc = self.store.read(execution_id, EXEC_ID)
        if doc is None:
            raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
        return as_exec(doc)

    def wait(self, execution_id: str, timeout: float | None = None, max_poll: float | None = None) -> ExecDoc:
        """Block until the execution ends; return its exec document. Woken by the notifier and
        never by it alone (``wait_for``: subscribed before the first read, the store read again
        each time; polled every 5% of the time waited, up to ``max_poll``, without a live push)."""
        last: list[ExecDoc] = []

        def ended() -> ExecDoc | None:
            last[:] = [self.read_exec(execution_id)]
            return last[0] if is_terminal(last[0]) else None

        return wait_for(
            self.notifier,
            execution_id,
            ended,
            timeout,
            self.settings.result_push_recheck,
            self.settings.result_poll_max if max_poll is None else max_poll,
            lambda: f"execution {execution_id!r} still {last[0].get('status')} after {timeout}s",
        )

    def cancel(
        self, execution_id: str, by: str | None = None, reason: str | None = None, from_parent: bool = False
    ) -> bool:
        """Persist a cancel request (never downgraded) and wake the execution; an operator's
        (``by``: who) is recorded with it (engine/admin/oplog.py). False when it had already ended.
        ``from_parent``: the cascade of its parent's cancel, marked on it (``CANCELLED_BY_PARENT``).
        """
        for _ in range(100):
            ex = self.read_exec(execution_id)
            if is_terminal(ex):
                return False
            if ex.get("status") in NOT_STARTED:  # none of its code ran: it ends now (engine/starts/deadlines.py)
                if by is not None:
                    check_field(OperationRefused, "by", by)
                if cancel_scheduled(self, ex, by, reason, from_parent):
                    return True
                continue
            if ex.get("cancel_requested") and by is None:
                return True  # an operator's (by) is recorded all the same: who else asked, and why
            updated = strip_reserved(ex)
            # the steps taken so far: a running attempt of one of them stops (engine/activities/leases.py);
            # later ones are the cancel's compensations (the write is etag-guarded against a drive)
            updated.update(cancel_requested=True, wakeups=count_of(ex, "wakeups") + 1)
            if not ex.get("cancel_requested"):  # a second request keeps the first's: steps since are compensations
                updated["cancel_before"] = count_of(ex, "steps")
            try:
                if by is None:  # a parent cancelling its child: its own history says so
                    if from_parent:  # the child's too: resuming the parent resumes it (cancel_withdrawal.py)
                        updated[CANCELLED_BY_PARENT] = True
                    self.store.replace(updated, if_match=ex["_etag"])
                else:
                    # an operator's cancel is the operator's, whoever asked first: no resume of
                    # a parent withdraws it
                    updated[CANCELLED_BY_PARENT] = None
                    self.store.batch(execution_id, cancel_ops(ex, updated, by, reason, self.clock.now()))
            except ConflictError:
                continue
            self.dispatcher.send_drive(execution_id)
            return True
        raise DurableError(f"could not record the cancel request of {execution_id!r}: too much contention")

    def reopen_child(self, child_id: str, parent_id: str) -> None:
        """Resume ``child_id``, which ended cancelled by its parent's cancel after an operator
        withdrew that cancel (the parent waits for it again: engine/children/holders.py ``withdrawn_cancels``).
        Recorded on the child like any resume; refused or failing, the parent's child scan asks
        again (the step stays due)."""
        try:
            resume_child(self, child_id, parent_id)
        except DurableError as exc:
            log.warning("child %s of %s not resumed yet: %s", child_id, parent_id, exc)

    def shutdown(self, release: bool = True) -> None:
        """Stop the heartbeat (and the result push listener); with ``release`` give back the
        activity leases this process holds."""
        self.leases.stop(release=release)
        self.notifier.close()

    def drive(self, execution_id: str) -> str:
        return self.driver.drive(execution_id)

    def signal(self, execution_id: str, name: str, value: Any, by: str | None = None) -> bool:
        """Send signal ``name`` (validated here; kept for the next wait); False once the execution
        ended. ``by``: an operator sending it, recorded with the value (engine/admin/oplog.py)."""
        check_signal_name(name)
        if by is not None:
            check_field(OperationRefused, "by", by)  # refused before anything is written
        return self.signals.signal(execution_id, name, value, by=by)

    def fire_clock(self, execution_id: str, seq: int, run: int = 0) -> ClockOutcome:
        return self.timers.fire_clock(execution_id, seq, run)

    def wake(self, execution_id: str) -> None:
        """Make sure a drive of ``execution_id`` happens after now (see :func:`.upkeep.wake`)."""
        wake(self, execution_id)

    def dispatch(self, send: Send) -> None:
        """Carry out what a committed drive decided."""
        if isinstance(send, ActivityRequest):
            self.dispatcher.send_activity(send)
        elif isinstance(send, ClockRequest):
            self.dispatcher.send_clock(send)
        elif isinstance(send, ChildRequest):
            self.children.start_child(send)
        elif isinstance(send, AdmitRequest):
            self._admit(send)
        elif isinstance(send, SignalRequest):
            self.signals.send_signal(send)
        elif send.parent is not None:
            self.children.cancel_child(send.execution_id, send.parent)
        else:
            try:
                self.cancel(send.execution_id, from_parent=True)
            except UnknownWorkflowError:
                pass

    def _admit(self, req: AdmitRequest) -> None:
        # The intent was committed with the drive: admitting it is idempotent, and if this fails
        # (or this process dies first) the intent stays due and beat's outbox scan admits it.
        try:
            doc = self.store.read(req.execution_id, req.doc_id)
            if doc is not None and doc.get("due_kind") == DUE_ADMIT:
                self.outbox.admit_intent(doc)
        except (StoreError, LaneFull) as exc:  # a full lane: the intent waits, due later
            log.warning("admitting effect %s of %s failed, the scan will: %s", req.doc_id, req.execution_id, exc)
