"""Replay: the workflow context and the futures durable calls return (DESIGN.md §6).

A drive re-runs the workflow function from the top inside a :class:`WorkflowContext`. Each
durable call takes the next sequence number and looks its step up in the history: a recorded
result is returned (or its error raised); a missing step is *recorded* (a new marker document,
committed by the driver) and *scheduled* (sent by the driver only after the commit), then the
function is unwound with :class:`Suspend`.

``Suspend`` and ``Fatal`` derive from ``BaseException`` so that user code's
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
from ..errors import ActivityError, NonDeterminismError, WorkflowCancelledError
from ..stores.base import Doc
from .dispatcher import ActivityRequest
from .model import DUE_ACTIVITY, marker_id, result_id

if TYPE_CHECKING:
    from .registry import Registry

__all__ = [
    "Suspend",
    "Fatal",
    "WorkflowContext",
    "DurableFuture",
    "current_context",
    "in_workflow",
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
    seq: int = 0
    new_docs: dict[str, Doc] = field(default_factory=dict)
    sends: list[ActivityRequest] = field(default_factory=list)
    #: recorded steps whose lease/due the driver should clear in its commit
    _rng: _random.Random | None = None

    # --- plumbing ---------------------------------------------------------------------

    def __enter__(self) -> WorkflowContext:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)

    def _doc(self, doc_id: str) -> Doc | None:
        doc = self.new_docs.get(doc_id)
        return doc if doc is not None else self.history.get(doc_id)

    def _step(self, kind: str, name: str) -> tuple[int, Doc | None, Doc | None]:
        """Advance to the next step; check it matches the history; return (seq, marker, result)."""
        self.seq += 1
        seq = self.seq
        marker = self._doc(marker_id(seq))
        if marker is not None and (marker.get("kind"), marker.get("name")) != (kind, name):
            raise Fatal(
                NonDeterminismError(
                    f"workflow {self.workflow!r} ({self.execution_id}) step {seq}: the history has "
                    f"{marker.get('kind')} {marker.get('name')!r} but the code now calls {kind} {name!r}"
                )
            )
        return seq, marker, self._doc(result_id(seq))

    def _marker(self, seq: int, kind: str, name: str, **extra: Any) -> Doc:
        doc: Doc = {
            "pk": self.execution_id,
            "id": marker_id(seq),
            "type": "step",
            "seq": seq,
            "kind": kind,
            "name": name,
            "created_at": self.now,
        }
        doc.update(extra)
        self.new_docs[doc["id"]] = doc
        return doc

    def suspend(self, pending: Iterable[int]) -> None:
        """Wait for the given steps. If a cancel was requested, deliver it here instead.

        The cancellation is recorded as the *result* of every pending step (create-only), so a
        replay raises it at exactly the same point even if a real result lands later.
        """
        pending = list(pending)
        if self.cancel_requested and pending:
            for seq in pending:
                rid = result_id(seq)
                if self._doc(rid) is None:
                    self.new_docs[rid] = {
                        "pk": self.execution_id,
                        "id": rid,
                        "type": "result",
                        "seq": seq,
                        "ok": False,
                        "cancelled": True,
                        "error": {"type": "WorkflowCancelledError", "message": "cancel requested"},
                        "completed_at": self.now,
                    }
            raise WorkflowCancelledError(f"workflow {self.execution_id!r} was cancelled")
        raise Suspend()

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
        seq, marker, result = self._step("activity", name)
        if marker is None:
            payload = codec.encode_args(args, kwargs)
            task_id = f"{self.execution_id}:{seq}"
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
                )
            )
        return DurableFuture(self, seq, name, codec.result)

    def side_effect(self, kind: str, produce: Callable[[], Any]) -> Any:
        """Record a non-deterministic value once (``now``/``uuid4``/``random``)."""
        seq, marker, _ = self._step(kind, kind)
        if marker is None:
            marker = self._marker(seq, kind, kind, value=produce())
        return marker["value"]

    def random(self) -> _random.Random:
        """A PRNG seeded once per execution from a recorded seed."""
        if self._rng is None:
            self._rng = _random.Random(self.side_effect("seed", lambda: _uuid.uuid4().int & (2**63 - 1)))
        return self._rng

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

    def __init__(self, ctx: WorkflowContext, seq: int, name: str, codec: ValueCodec) -> None:
        self._ctx = ctx
        self.seq = seq
        self.name = name
        self._codec = codec

    def _result_doc(self) -> Doc | None:
        return self._ctx._doc(result_id(self.seq))

    def done(self) -> bool:
        return self._result_doc() is not None

    def result(self) -> T:
        doc = self._result_doc()
        if doc is None:
            self._ctx.suspend([self.seq])
            raise AssertionError("unreachable")  # pragma: no cover
        if doc.get("ok"):
            value: T = self._codec.decode(doc.get("value"), f"result of {self.name}")
            return value
        err = doc.get("error") or {}
        if doc.get("cancelled"):
            raise WorkflowCancelledError(f"workflow {self._ctx.execution_id!r} was cancelled")
        raise ActivityError(
            self.name, str(err.get("type", "Error")), str(err.get("message", "")), int(err.get("attempts", 1))
        )

    def __repr__(self) -> str:
        return f"<DurableFuture step={self.seq} {self.name} done={self.done()}>"
