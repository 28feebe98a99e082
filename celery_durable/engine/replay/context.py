"""Replay: the workflow context and the futures durable calls return (docs/architecture.md §6, §7).

A drive re-runs the workflow function from the top inside a :class:`WorkflowContext`. Each
durable call takes the next sequence number and looks its step up in the history: a recorded
result is returned (or its error raised); a missing step is *recorded* (a new marker document,
committed by the driver) and *scheduled* (sent by the driver only after the commit), then the
function is unwound with :class:`Suspend`.

``Suspend``, ``Fatal`` and ``ContinueAsNew`` derive from ``BaseException`` so that user code's
``except Exception`` cannot swallow engine control flow (the same trick DBOS uses).
"""

from __future__ import annotations

import contextvars
import random as _random
import uuid as _uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from celery_durable.codecs import CallCodec, ValueCodec, fresh
from celery_durable.engine.dispatcher import (
    ActivityRequest,
    AdmitRequest,
    CancelRequest,
    ChildRequest,
    ClockRequest,
    Send,
)
from celery_durable.engine.documents.checks import check_workflow_id, consumed_by, pending_signal_values, signal_mark_id
from celery_durable.engine.documents.model import DUE_ACTIVITY, DUE_CHILD, DUE_CLOCK, marker_id, result_id
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.documents.schema import (
    activity_task_id,
    child_execution_id,
    default_effect_id,
    signal_outcome_id,
    wait_decision_id,
)
from celery_durable.engine.limits.spec import LIMIT_RECORD, limit_fields, workflow_limit
from celery_durable.engine.outbox.model import DUE_ADMIT
from celery_durable.engine.outbox.runtime import effects_of
from celery_durable.engine.replay.cancels import TIMED_OUT_ERROR, cancel_error, cancelled
from celery_durable.engine.replay.decoded import decoded
from celery_durable.engine.replay.failures import FAILED_STEP, failed_step
from celery_durable.engine.replay.futures import DurableFuture
from celery_durable.errors import (
    ActivityError,
    ChildWorkflowError,
    ConfigurationError,
    DurableTimeoutError,
    ExternalSignalError,
    NonDeterminismError,
    PayloadValidationError,
)
from celery_durable.stores.base import Doc

if TYPE_CHECKING:
    from celery_durable.engine.registry import Registry, WorkflowDef

__all__ = [
    "Suspend",
    "Fatal",
    "ContinueAsNew",
    "WorkflowContext",
    "DurableFuture",
    "LocalStep",
    "current_context",
    "in_workflow",
    "require_context",
    "child_execution_id",
    "failed_step",
]

T = TypeVar("T")

_current: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar("celery_durable_ctx", default=None)


class Suspend(BaseException):
    """Unwinds the workflow function: it waits for a step that has no result yet."""


class Fatal(BaseException):
    """Unwinds the workflow function with an engine error user code must not catch."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ContinueAsNew(BaseException):
    """Unwinds the workflow function to restart it with a fresh history and new arguments."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("continue as new")
        self.payload = payload


def current_context() -> WorkflowContext | None:
    """The context of the workflow being replayed in this thread, if any."""
    return _current.get()


def in_workflow() -> bool:
    """Whether the caller runs inside a workflow function."""
    return _current.get() is not None


def require_context(what: str) -> WorkflowContext:
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(f"{what} can only be used inside a workflow function")
    return ctx


@dataclass(frozen=True)
class LocalStep:
    """A local activity step without an outcome: its marker as recorded or as just taken."""

    seq: int
    name: str
    marker: Doc


@dataclass
class WorkflowContext:
    """State of one replay of one execution."""

    execution_id: str
    workflow: str
    history: dict[str, Doc]
    now: float
    registry: Registry
    cancel_requested: bool = False
    #: the cancel is its deadline's: delivered as WorkflowTimedOutError (engine/starts/deadlines.py)
    timed_out: bool = False
    deadline_at: float | None = None  # its own deadline: a child's is capped by it (start_child)
    activity_queue_timeout: float = 300.0
    #: an emitted effect's intent not admitted by its drive is admitted by the scan after this
    admit_grace: float = 10.0
    run: int = 0
    signal_types: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    new_docs: dict[str, Doc] = field(default_factory=dict)
    sends: list[Send] = field(default_factory=list)
    #: the cancel request has been raised at a suspension point (in this replay or before)
    cancel_delivered: bool = False
    #: a query's replay: what it decides is discarded, nothing is written or sent (engine/replay/queries.py)
    read_only: bool = False
    #: set while a query handler (or an update's validator or handler) runs: durable calls are refused
    answering: str | None = None
    #: query handlers registered by the workflow code (``wf.set_query_handler``) in this replay
    query_handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    #: update handlers (``wf.set_update_handler``) by name, applied at wait points (engine/replay/updates.py)
    update_handlers: dict[str, Any] = field(default_factory=dict)
    on_wait: Callable[[WorkflowContext], None] | None = None  # history.replay: updates.at_wait
    #: the JSON value of the last ``wf.set_status`` in this replay (``status_set``: it was called)
    custom_status: Any = None
    status_set: bool = False
    search_updates: dict[str, Any] = field(default_factory=dict)  # wf.upsert_search's (engine/documents/search.py)
    #: ``wf.patched`` answers of this replay, by change id (asked again: the same answer)
    patches: dict[str, bool] = field(default_factory=dict)
    #: operations that re-ran the execution (reruns.rerun_count): ids of steps taken anew change
    resets: int = 0
    #: local activity steps this replay waits for: the driver runs them in its process
    local_steps: list[LocalStep] = field(default_factory=list)
    park: Callable[[], None] | None = None  # a live instance parks here, not unwound (engine/replay/sticky.py)
    unwinding: bool = False  # it raised Suspend: it decides nothing more (refuse_in_query)
    #: the steps the last suspension waits for (their seqs): the exec's ``waiting``
    waiting: list[int] = field(default_factory=list)
    _rng: _random.Random | None = None

    # --- plumbing ---------------------------------------------------------------------

    def __enter__(self) -> WorkflowContext:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)

    def doc(self, doc_id: str) -> Doc | None:
        doc = self.new_docs.get(doc_id)
        return doc if doc is not None else self.history.get(doc_id)

    def _step(self, kind: str, name: str) -> tuple[int, Doc | None]:
        """Advance to the next step and check it matches the history; return (seq, marker)."""
        self.refuse_in_query(f"a durable call ({kind} {name!r})")
        self.seq += 1
        seq = self.seq
        marker = self.doc(marker_id(seq, self.run))
        if marker is not None and (marker.get("kind"), marker.get("name")) != (kind, name):
            hint = ""
            if marker.get("kind") == "patch":
                hint = f" (keep wf.deprecate_patch({marker.get('name')!r}) here while executions that took it run)"
            raise Fatal(
                NonDeterminismError(
                    f"workflow {self.workflow!r} ({self.execution_id}) step {seq}: the history has "
                    f"{marker.get('kind')} {marker.get('name')!r} but the code now calls {kind} {name!r}{hint}"
                )
            )
        return seq, marker

    def refuse_in_query(self, what: str) -> None:
        """A query handler only reads: ``what`` (a durable call, a status change) is refused in one."""
        if self.answering is not None:
            raise RuntimeError(f"{self.answering} cannot make {what}: queries only read, updates never wait")
        if self.unwinding and not self.read_only:  # past a suspension (finally, a swallowed Suspend): a
            raise Suspend()  # parked instance (engine/replay/sticky.py) never runs this, a full replay decides alike

    def _marker(self, seq: int, kind: str, name: str, **extra: Any) -> Doc:
        doc: Doc = {
            "pk": self.execution_id,
            "id": marker_id(seq, self.run),
            "type": "step",
            "run": self.run,
            "seq": seq,
            "kind": kind,
            "name": name,
            "created_at": self.now,
        }
        doc.update(extra)
        self.new_docs[doc["id"]] = doc
        return doc

    def _outcome_id(self, seq: int) -> str:
        """Where step ``seq``'s outcome lives: its result doc, or for a signal wait its decision."""
        marker = self.doc(marker_id(seq, self.run))
        if marker is not None and marker.get("kind") == "signal":
            return signal_outcome_id(marker, self.run)
        return result_id(seq, self.run)

    def suspend(self, pending: Iterable[int]) -> None:
        """Wait for the given steps. If a cancel was requested, deliver it here instead: recorded as
        the *outcome* of every pending step (create-only), so a replay raises it at exactly the same
        point even if a real result lands later; pending children are cancelled too."""
        pending = list(pending)
        self.waiting = pending  # what the commit says the execution waits on (Replay.waiting)
        if self.cancel_requested and not self.cancel_delivered and pending:
            self._cancel_children()
            for seq in pending:
                oid = self._outcome_id(seq)
                if self.doc(oid) is None:
                    self.new_docs[oid] = {
                        "pk": self.execution_id,
                        "id": oid,
                        "type": "result",
                        "run": self.run,
                        "seq": seq,
                        "ok": False,
                        "cancelled": True,
                        "error": cancel_error(self.timed_out),
                        "completed_at": self.now,
                        # the last step taken before the cancel: later ones are its compensations
                        # (admin resume forgets them; step order, as clocks of workers disagree)
                        "cancel_at": self.seq,
                    }
            self.cancel_delivered = True
            raise cancelled(self.execution_id, self.timed_out)
        if self.park is None:
            self.unwinding = True
            raise Suspend()
        self.park()  # a live instance waits here; resumed with a newer history, the caller looks again

    def at_wait(self) -> None:
        """A wait point: accepted updates are applied here, before the outcome is looked at."""
        if self.on_wait is not None:
            self.on_wait(self)

    def settled(self, seq: int) -> bool:
        """Whether step ``seq`` has an outcome in the history *as read by this replay*.

        Not deterministic across replays: only for engine decisions that record nothing
        (suspend or go on). Workflow code asks :meth:`DurableFuture.done`, which is recorded.
        """
        return self.doc(self._outcome_id(seq)) is not None

    def future_done(self, seq: int, name: str) -> bool:
        """Answer ``done()`` for step ``seq`` once and record the answer as a step of its own."""
        step, marker = self._step("done", name)
        if marker is None:
            marker = self._marker(step, "done", name, of=seq, value=self.settled(seq))
        elif marker.get("of") != seq:
            raise Fatal(
                NonDeterminismError(
                    f"workflow {self.workflow!r} ({self.execution_id}) step {step}: the history asked whether "
                    f"step {marker.get('of')} was done but the code now asks about step {seq}"
                )
            )
        return bool(marker["value"])

    def _cancel_children(self) -> None:
        for doc in list(self.history.values()) + list(self.new_docs.values()):
            if doc.get("type") == "step" and doc.get("kind") == "child" and doc.get("run", 0) == self.run:
                seq = int(doc["seq"])
                if self.doc(result_id(seq, self.run)) is None:
                    link = (self.execution_id, self.run, seq)
                    self.sends.append(CancelRequest(str(doc["child_id"]), parent=link))

    def outcome(self, seq: int, name: str, codec: ValueCodec, kind: str = "activity") -> Any:
        """Return step ``seq``'s recorded value or raise its recorded error; suspend if none."""
        self.at_wait()
        while (doc := self.doc(self._outcome_id(seq))) is None:
            self.suspend([seq])
        if doc.get("cancelled"):
            self.cancel_delivered = True
            raise cancelled(self.execution_id, (doc.get("error") or {}).get("type") == TIMED_OUT_ERROR)
        if doc.get("timeout"):
            raise DurableTimeoutError(f"timed out waiting for {kind} {name!r}")
        if doc.get("ok", True):
            return decoded(self.execution_id, self.run, seq, doc, codec, f"{kind} {name!r}")
        err = doc.get("error") or {}
        type_name, message = str(err.get("type", "Error")), str(err.get("message", ""))
        exc: ActivityError | ChildWorkflowError | ExternalSignalError
        if kind == "child":
            exc = ChildWorkflowError(name, str(doc.get("child_id", "")), type_name, message)
        elif kind == "signal_send":
            exc = ExternalSignalError(name, str(doc.get("target", "")), type_name, message)
        else:
            exc = ActivityError(name, type_name, message, int(err.get("attempts", 1)))
        # if this very object ends the execution, the replay records which step failed it (retry
        # re-runs that step; a failure caught, or re-raised as another error, is not the cause)
        setattr(exc, FAILED_STEP, (seq, self.seq))
        raise exc

    # --- durable calls ------------------------------------------------------------------

    def call_activity(
        self,
        name: str,
        codec: CallCodec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any] | None = None,
    ) -> DurableFuture[Any]:
        """Record (once) and schedule an activity; return its future."""
        seq, marker = self._step("activity", name)
        local = (options or {}).get("local")
        if local and marker is None:
            # a local activity: the drive runs it in its own process and commits the marker with
            # its result (engine/activities/local_activities.py); nothing is sent
            payload = codec.encode_args(args, kwargs)
            marker = self._marker(seq, "activity", name, input=payload, attempts=0, local=True)
        if marker is not None and marker.get("local"):
            if self.doc(result_id(seq, self.run)) is None:
                self.local_steps.append(LocalStep(seq, name, marker))
            return DurableFuture(self, seq, name, codec.result)
        if marker is None:
            payload = codec.encode_args(args, kwargs)
            task_id = activity_task_id(self.execution_id, self.run, seq)  # derived: not stored (task_id_of)
            extra = limit_fields(options, args, kwargs, self.execution_id, self.now)  # engine/limits/spec.py
            self._marker(
                seq,
                "activity",
                name,
                input=payload,
                attempts=0,
                due_kind=DUE_ACTIVITY,
                due_at=self.now + self.activity_queue_timeout,
                **extra,
            )
            self.sends.append(
                ActivityRequest(
                    execution_id=self.execution_id,
                    seq=seq,
                    name=name,
                    args=fresh(payload["args"]),  # the message must not alias the recorded marker
                    kwargs=fresh(payload["kwargs"]),
                    task_id=task_id,
                    workflow=self.workflow,
                    # with its limit record: the drive's dispatch queues it on the limit (engine/limits/)
                    options=dict(options or {}, **{LIMIT_RECORD: extra["limit"]} if extra else {}),
                    run=self.run,
                )
            )
        return DurableFuture(self, seq, name, codec.result)

    def side_effect(self, kind: str, produce: Callable[[], Any]) -> Any:
        """Record a non-deterministic value once (``now``/``uuid4``/``random``)."""
        seq, marker = self._step(kind, kind)
        if marker is None:
            marker = self._marker(seq, kind, kind, value=produce())
        return fresh(marker["value"])  # workflow code may mutate it; the record must not change

    def emit(self, effect_type: str, payload: Any, key: str | None, effect_id: str | None, delay: float) -> str:
        """Record an outbox effect as a step; it is admitted to the outbox after the commit.

        The marker is the effect's intent (due ``outbox_admit``): the committing worker admits
        it right after the commit, beat's outbox scan if that worker died first. Replay finds
        the marker and records nothing, so an emit is enqueued exactly once.
        """
        seq, marker = self._step("emit", effect_type)
        if marker is None:
            definition = effects_of(self.registry).require(effect_type)
            eid = effect_id or default_effect_id(self.execution_id, self.run, seq, self.resets)
            created = self.now + seq * 1e-6  # keeps call order within one drive
            effect = {
                "id": eid,
                "type": effect_type,
                "key": key or self.execution_id,
                "payload": definition.encode(payload),
                "created_at": created,
                "available_at": created + max(0.0, delay),
                "replay_safe": definition.replay_safe,
                "max_attempts": definition.policy.maximum_attempts,
            }
            due = created + self.admit_grace
            marker = self._marker(seq, "emit", effect_type, effect=effect, due_kind=DUE_ADMIT, due_at=due)
            marker["rerun"] = self.resets  # the row's source: a re-run's marker has the old one's id
            self.sends.append(AdmitRequest(self.execution_id, str(marker["id"])))
        return str(marker["effect"]["id"])

    def random(self) -> _random.Random:
        """A PRNG seeded once per execution from a recorded seed."""
        if self._rng is None:
            # 53 bits: a JSON number every store (Cosmos: a double) gives back exactly
            self._rng = _random.Random(self.side_effect("seed", lambda: _uuid.uuid4().int & (2**53 - 1)))
        return self._rng

    def sleep_until(self, fire_at: float) -> DurableFuture[None]:
        """A durable timer: a clock document that the fast path or beat's scan fires."""
        seq, marker = self._step("sleep", "sleep")
        if marker is None:
            self._marker(seq, "sleep", "sleep", fire_at=fire_at, due_kind=DUE_CLOCK, due_at=fire_at)
            self.sends.append(ClockRequest(self.execution_id, seq, fire_at, self.run))
        return DurableFuture(self, seq, "sleep", ValueCodec(Any), kind="sleep")

    def wait_signal(self, name: str, codec: ValueCodec, timeout_at: float | None) -> DurableFuture[Any]:
        """Wait for the next valid value of signal ``name`` (sent before or after this point).

        Each wait is a step with its own decision ``w<run>:<seq>`` (the marker names it in
        ``decision``), recorded by the replay that finds a value for it (see
        :meth:`_decide_signal`) or its timeout: successive waits consume successive values.
        """
        if self.signal_types and name not in self.signal_types:
            # every sender refuses an undeclared name: the wait could never end
            raise Fatal(
                ConfigurationError(
                    f"workflow {self.workflow!r} waits for signal {name!r} but declares only "
                    f"{sorted(self.signal_types)}: add it to signals={{...}}"
                )
            )
        seq, marker = self._step("signal", name)
        new = marker is None
        if marker is None:
            marker = self._marker(seq, "signal", name, decision=wait_decision_id(seq, self.run))
        decided = self._decide_signal(seq, marker, codec)
        if new and timeout_at is not None and not decided:
            marker.update(fire_at=timeout_at, due_kind=DUE_CLOCK, due_at=timeout_at)
            self.sends.append(ClockRequest(self.execution_id, seq, timeout_at, self.run))
        return DurableFuture(self, seq, name, codec, kind="signal")

    def _decide_signal(self, seq: int, marker: Doc, codec: ValueCodec | Mapping[str, ValueCodec]) -> bool:
        """Decide signal wait ``seq`` if the history allows; return whether it is decided.

        Values sent for the wait's name (or, for ``wf.wait_any``, any of the ``names`` its marker
        lists) and not yet settled (by this wait or an earlier one) are tried oldest first, in
        arrival order across the names, against the type of their name: an invalid one is
        recorded as rejected (``signal_rejected``) and skipped, the first valid one is consumed;
        the others stay for the next waits (or the next run). If the wait's timer fired
        (``r:<seq>``), only values sent before it compete; none valid means the timeout wins, and
        values sent after it stay. All of it is recorded with the drive's commit, so the decision
        is made once: later replays find it (:func:`.schema.signal_outcome_id`); the decision
        names the channel it took its value from.
        """
        names = [str(n) for n in marker.get("names") or [marker["name"]]]
        codecs = codec if isinstance(codec, Mapping) else {names[0]: codec}
        oid = signal_outcome_id(marker, self.run)
        if self.doc(oid) is not None:
            return True
        timer = self.doc(result_id(seq, self.run))
        horizon = count_of(timer, "signals_seen") if timer is not None and timer.get("timeout") else None
        pending = sorted(
            (v for n in names for v in pending_signal_values(self.history, n) if self.doc(self._settle_id(v)) is None),
            key=lambda v: int(v["n"]),
        )
        chosen = consumed_by(self.history, self.run, seq, names)  # a commit cut short recorded its mark only
        for value in pending if chosen is None else ():
            if horizon is not None and int(value["n"]) > horizon:
                break
            try:
                codecs[str(value["name"])].decode(value.get("value"), f"signal {value['name']!r}")
            except PayloadValidationError as exc:
                error = {"type": type(exc).__name__, "message": str(exc)}
                self._settle(value, seq, "signal_rejected", value=value.get("value"), error=error)
                continue
            chosen = value
            break
        if chosen is None and horizon is None:
            return False
        decision: Doc = {"pk": self.execution_id, "id": oid, "type": "signal", "run": self.run, "seq": seq}
        if chosen is not None:
            self._settle(chosen, seq, "signal_consumed")
            decision.update(name=chosen["name"], ok=True, value=chosen.get("value"), value_id=chosen["id"])
            decision.update(sent_at=chosen.get("sent_at"), received_at=self.now)
        else:
            decision.update(name=marker["name"], ok=False, timeout=True, fired_at=(timer or {}).get("fired_at"))
        self.new_docs[oid] = decision
        return True

    @staticmethod
    def _settle_id(value: Doc) -> str:
        return signal_mark_id(int(value["n"]))

    def _settle(self, sent: Doc, seq: int, kind: str, **extra: Any) -> None:
        mark: Doc = {
            "pk": self.execution_id,
            "id": self._settle_id(sent),
            "type": kind,
            "name": sent["name"],
            "value_id": sent["id"],
            "run": self.run,
            "seq": seq,
            "at": self.now,
        }
        mark.update(extra)
        self.new_docs[mark["id"]] = mark

    def start_child(
        self,
        definition: WorkflowDef,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        child_id: str | None,
        timeout: float | None = None,
    ) -> DurableFuture[Any]:
        """Start a child workflow (idempotent by its derived id); return its future.

        An explicit ``child_id`` must pass :func:`check_workflow_id` (else :class:`InvalidWorkflowId`
        here). Held by this parent's child of the same workflow and input, the step joins it;
        held otherwise, the step fails (:class:`ChildWorkflowError`, ``ChildIdTaken``) when
        awaited; see ``Children.start_child``.
        """
        seq, marker = self._step("child", definition.name)
        if marker is None:
            # checked for new steps only: a recorded step keeps the id it was started with
            # the caller's id obeys start()'s rules (so it can never be a derived child id);
            # InvalidWorkflowId is raised here, at the call, where the workflow can handle it
            cid = (
                child_execution_id(self.execution_id, self.run, seq, self.resets)
                if child_id is None
                else check_workflow_id(child_id, "child workflow id")
            )
            payload = definition.codec.encode_args(args, kwargs)
            # its deadline: the earlier of its own (from this step) and ours (engine/starts/deadlines.py)
            # a deadline already delivered (this is a compensation) no longer caps anything
            ours = None if self.timed_out and self.cancel_delivered else self.deadline_at
            ends = [t for t in (ours, None if timeout is None else self.now + timeout) if t is not None]
            queueing = workflow_limit(definition.limit, None, args, kwargs, self.execution_id, self.now)  # its limit=
            extra: dict[str, Any] = {"deadline_at": min(ends)} if ends else {}
            extra |= {"child_limit": queueing} if queueing else {}
            due = {"due_kind": DUE_CHILD, "due_at": self.now + self.activity_queue_timeout}
            self._marker(seq, "child", definition.name, child_id=cid, input=payload, **due, **extra)
            deadline = min(ends, default=None)
            req = ChildRequest(
                self.execution_id, seq, definition.name, fresh(payload), cid, self.run, deadline, queueing
            )
            self.sends.append(req)
        else:
            cid = str(marker["child_id"])
        future: DurableFuture[Any] = DurableFuture(self, seq, definition.name, definition.codec.result, kind="child")
        future._child_id = cid
        return future

    def start_signature(self, sig: Any) -> DurableFuture[Any]:
        """Start an activity from a Celery-style signature (``task.s(...)``) or pass a future on."""
        if isinstance(sig, DurableFuture):
            return sig
        name = getattr(sig, "task", None)
        if not isinstance(name, str):
            raise TypeError(f"expected a durable future or an activity signature, got {sig!r}")
        activity = self.registry.activity(name)
        if activity is None:
            raise TypeError(f"{name!r} is not a durable activity")
        options = activity.options
        priority = (getattr(sig, "options", None) or {}).get("priority")
        if priority is not None:  # Celery's own spelling: limited.s(...).set(priority=1)
            options = dict(options, priority=priority)
        return self.call_activity(name, activity.codec, tuple(sig.args), dict(sig.kwargs), options)

    def gather(self, items: Iterable[Any]) -> list[Any]:
        """Start all, wait for all; then return results in order or raise the first failure."""
        futures = [self.start_signature(item) for item in items]
        self.at_wait()
        while pending := [f.seq for f in futures if not self.settled(f.seq)]:
            self.suspend(pending)
        return [f.result() for f in futures]
