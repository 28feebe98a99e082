"""Replay: the workflow context and the futures durable calls return (DESIGN.md §6, §7).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..codecs import CallCodec, ValueCodec
from ..errors import (
    ActivityError,
    ChildWorkflowError,
    DurableTimeoutError,
    NonDeterminismError,
    WorkflowCancelledError,
)
from ..stores.base import Doc
from .dispatcher import ActivityRequest, CancelRequest, ChildRequest, ClockRequest
from .model import DUE_ACTIVITY, DUE_CHILD, DUE_CLOCK, marker_id, result_id, signal_id
from .outbox.model import DUE_ADMIT, OutboxSettings, note_intent
from .outbox.runtime import effects_of

if TYPE_CHECKING:
    from .registry import Registry, WorkflowDef

__all__ = [
    "Suspend",
    "Fatal",
    "ContinueAsNew",
    "WorkflowContext",
    "DurableFuture",
    "current_context",
    "in_workflow",
    "require_context",
]

T = TypeVar("T")

Send = ActivityRequest | ClockRequest | ChildRequest | CancelRequest

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


@dataclass
class WorkflowContext:
    """State of one replay of one execution."""

    execution_id: str
    workflow: str
    history: dict[str, Doc]
    now: float
    registry: Registry
    cancel_requested: bool = False
    activity_queue_timeout: float = 300.0
    run: int = 0
    signal_types: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    new_docs: dict[str, Doc] = field(default_factory=dict)
    sends: list[Send] = field(default_factory=list)
    #: the cancel request has been raised at a suspension point (in this replay or before)
    cancel_delivered: bool = False
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
        self.seq += 1
        seq = self.seq
        marker = self.doc(marker_id(seq, self.run))
        if marker is not None and (marker.get("kind"), marker.get("name")) != (kind, name):
            raise Fatal(
                NonDeterminismError(
                    f"workflow {self.workflow!r} ({self.execution_id}) step {seq}: the history has "
                    f"{marker.get('kind')} {marker.get('name')!r} but the code now calls {kind} {name!r}"
                )
            )
        return seq, marker

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
        """Where step ``seq``'s outcome lives: its result doc, or for a signal wait the signal."""
        marker = self.doc(marker_id(seq, self.run))
        if marker is not None and marker.get("kind") == "signal":
            return signal_id(str(marker["name"]), self.run)
        return result_id(seq, self.run)

    def suspend(self, pending: Iterable[int]) -> None:
        """Wait for the given steps. If a cancel was requested, deliver it here instead.

        The cancellation is recorded as the *outcome* of every pending step (create-only), so a
        replay raises it at exactly the same point even if a real result lands later. Pending
        children are cancelled too.
        """
        pending = list(pending)
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
                        "error": {"type": "WorkflowCancelledError", "message": "cancel requested"},
                        "completed_at": self.now,
                    }
            self.cancel_delivered = True
            raise WorkflowCancelledError(f"workflow {self.execution_id!r} was cancelled")
        raise Suspend()

    def _cancel_children(self) -> None:
        for doc in list(self.history.values()) + list(self.new_docs.values()):
            if doc.get("type") == "step" and doc.get("kind") == "child" and doc.get("run", 0) == self.run:
                if self.doc(result_id(int(doc["seq"]), self.run)) is None:
                    self.sends.append(CancelRequest(str(doc["child_id"])))

    def outcome(self, seq: int, name: str, codec: ValueCodec, kind: str = "activity") -> Any:
        """Return step ``seq``'s recorded value or raise its recorded error; suspend if none."""
        doc = self.doc(self._outcome_id(seq))
        if doc is None:
            self.suspend([seq])
            raise AssertionError("unreachable")  # pragma: no cover
        if doc.get("cancelled"):
            self.cancel_delivered = True
            raise WorkflowCancelledError(f"workflow {self.execution_id!r} was cancelled")
        if doc.get("timeout"):
            raise DurableTimeoutError(f"timed out waiting for {kind} {name!r}")
        if doc.get("ok", True):
            return codec.decode(doc.get("value"), f"{kind} {name!r}")
        err = doc.get("error") or {}
        type_name, message = str(err.get("type", "Error")), str(err.get("message", ""))
        if kind == "child":
            raise ChildWorkflowError(name, str(doc.get("child_id", "")), type_name, message)
        raise ActivityError(name, type_name, message, int(err.get("attempts", 1)))

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
        if marker is None:
            payload = codec.encode_args(args, kwargs)
            task_id = f"{self.execution_id}:{self.run}:{seq}" if self.run else f"{self.execution_id}:{seq}"
            self._marker(
                seq,
                "activity",
                name,
                input=payload,
                task_id=task_id,
                attempts=0,
                due_kind=DUE_ACTIVITY,
                due_at=self.now + self.activity_queue_timeout,
            )
            self.sends.append(
                ActivityRequest(
                    execution_id=self.execution_id,
                    seq=seq,
                    name=name,
                    args=payload["args"],
                    kwargs=payload["kwargs"],
                    task_id=task_id,
                    workflow=self.workflow,
                    options=dict(options or {}),
                    run=self.run,
                )
            )
        return DurableFuture(self, seq, name, codec.result)

    def side_effect(self, kind: str, produce: Callable[[], Any]) -> Any:
        """Record a non-deterministic value once (``now``/``uuid4``/``random``)."""
        seq, marker = self._step(kind, kind)
        if marker is None:
            marker = self._marker(seq, kind, kind, value=produce())
        return marker["value"]

    def emit(self, effect_type: str, payload: Any, key: str | None, effect_id: str | None, delay: float) -> str:
        """Record an outbox effect as a step; it is admitted to the outbox after the commit.

        The marker is the effect's intent (due ``outbox_admit``): the committing worker admits
        it right after the commit, beat's outbox scan if that worker died first. Replay finds
        the marker and records nothing, so an emit is enqueued exactly once.
        """
        seq, marker = self._step("emit", effect_type)
        if marker is None:
            definition = effects_of(self.registry).require(effect_type)
            run = f":{self.run}" if self.run else ""
            eid = effect_id or f"{self.execution_id}{run}:{seq:06d}"
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
            due = created + OutboxSettings.admit_grace
            marker = self._marker(seq, "emit", effect_type, effect=effect, due_kind=DUE_ADMIT, due_at=due)
            note_intent(self.execution_id, str(marker["id"]))
        return str(marker["effect"]["id"])

    def random(self) -> _random.Random:
        """A PRNG seeded once per execution from a recorded seed."""
        if self._rng is None:
            self._rng = _random.Random(self.side_effect("seed", lambda: _uuid.uuid4().int & (2**63 - 1)))
        return self._rng

    def sleep_until(self, fire_at: float) -> DurableFuture[None]:
        """A durable timer: a clock document that the fast path or beat's scan fires."""
        seq, marker = self._step("sleep", "sleep")
        if marker is None:
            self._marker(seq, "sleep", "sleep", fire_at=fire_at, due_kind=DUE_CLOCK, due_at=fire_at)
            self.sends.append(ClockRequest(self.execution_id, seq, fire_at, self.run))
        return DurableFuture(self, seq, "sleep", ValueCodec(Any), kind="sleep")

    def wait_signal(self, name: str, codec: ValueCodec, timeout_at: float | None) -> DurableFuture[Any]:
        """Wait for signal ``name`` (delivered before or after this point); first value wins."""
        seq, marker = self._step("signal", name)
        if marker is None:
            extra: dict[str, Any] = {}
            if timeout_at is not None and self.doc(signal_id(name, self.run)) is None:
                extra = {"fire_at": timeout_at, "due_kind": DUE_CLOCK, "due_at": timeout_at}
                self.sends.append(ClockRequest(self.execution_id, seq, timeout_at, self.run))
            self._marker(seq, "signal", name, **extra)
        return DurableFuture(self, seq, name, codec, kind="signal")

    def start_child(
        self, definition: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any], child_id: str | None
    ) -> DurableFuture[Any]:
        """Start a child workflow (idempotent by its derived id); return its future."""
        seq, marker = self._step("child", definition.name)
        if marker is None:
            payload = definition.codec.encode_args(args, kwargs)
            cid = child_id or f"{self.execution_id}-c{self.run or ''}{seq}"
            self._marker(
                seq,
                "child",
                definition.name,
                child_id=cid,
                input=payload,
                due_kind=DUE_CHILD,
                due_at=self.now + self.activity_queue_timeout,
            )
            self.sends.append(ChildRequest(self.execution_id, seq, definition.name, payload, cid, self.run))
        return DurableFuture(self, seq, definition.name, definition.codec.result, kind="child")

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
        return self.call_activity(name, activity.codec, tuple(sig.args), dict(sig.kwargs), activity.options)

    def gather(self, items: Iterable[Any]) -> list[Any]:
        """Start all, wait for all; then return results in order or raise the first failure."""
        futures = [self.start_signature(item) for item in items]
        pending = [f.seq for f in futures if not f.done()]
        if pending:
            self.suspend(pending)
        return [f.result() for f in futures]


class DurableFuture(Generic[T]):
    """The eventual result of a durable step; ``result()`` waits durably."""

    def __init__(self, ctx: WorkflowContext, seq: int, name: str, codec: ValueCodec, kind: str = "activity") -> None:
        self._ctx = ctx
        self.seq = seq
        self.name = name
        self.kind = kind
        self._codec = codec

    def done(self) -> bool:
        return self._ctx.doc(self._ctx._outcome_id(self.seq)) is not None

    def result(self) -> T:
        value: T = self._ctx.outcome(self.seq, self.name, self._codec, self.kind)
        return value

    def __repr__(self) -> str:
        return f"<DurableFuture step={self.seq} {self.kind} {self.name} done={self.done()}>"
