"""The engine's one transport: its only way to make work happen elsewhere (docs/architecture.md §3).

The engine never imports Celery: it asks a :class:`Dispatcher` to "run this activity", "drive
this execution", "fire this clock at t" or "run this effect". The Celery glue implements it with
tasks; unit tests use :class:`InlineDispatcher`, which queues the work and runs it in-process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_durable.engine.outbox.model import EffectRef

__all__ = [
    "ActivityRequest",
    "ClockRequest",
    "ChildRequest",
    "CancelRequest",
    "AdmitRequest",
    "SignalRequest",
    "Send",
    "Dispatcher",
    "InlineDispatcher",
]


@dataclass(frozen=True)
class ActivityRequest:
    """One activity attempt to send: deterministic ``task_id`` so duplicates are recognisable."""

    execution_id: str
    seq: int
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    task_id: str
    workflow: str
    options: dict[str, Any] = field(default_factory=dict)
    run: int = 0
    #: the marker's token (engine/activities/delivery.py): the message proves which marker it is for
    token: str | None = None
    #: the lease holder of its first attempt, taken by the commit that scheduled it because the
    #: dispatcher keeps it to run next in this process (``Dispatcher.keeps``); never on a message
    holder: str | None = None
    #: a slot of its limit was just handed to it by an attempt that ended in this process
    #: (engine/limits/grants.py): the limit document's partition and the attempt number granted.
    #: The delivery that freed the slot may run it next (no lease is taken for it: a process
    #: killed first leaves the grant to the limit's recovery scan); never on a message
    handoff: tuple[str, int] | None = None

    def grant(self) -> tuple[str, int, str | None] | None:
        """The slot handed to it (limit partition, attempt number, marker token), if any."""
        return None if self.handoff is None else (self.handoff[0], self.handoff[1], self.token)

    @property
    def key(self) -> str:
        return f"activity:{self.task_id}"


@dataclass(frozen=True)
class ClockRequest:
    """Fire step ``seq`` of ``execution_id`` at ``fire_at`` (epoch seconds)."""

    execution_id: str
    seq: int
    fire_at: float
    run: int = 0

    @property
    def key(self) -> str:
        return f"clock:{self.execution_id}:{self.run}:{self.seq}"


@dataclass(frozen=True)
class ChildRequest:
    """Start a child execution (done by the engine itself after the parent's commit)."""

    parent_id: str
    seq: int
    workflow: str
    payload: dict[str, Any]
    child_id: str
    run: int = 0
    #: the child's deadline (its own timeout capped by the parent's deadline), if any
    deadline_at: float | None = None
    #: the limit the child waits on (its workflow's ``limit=``: engine/limits/workflows.py)
    limit: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        # per step, not per child id: two steps may name one explicit id (joined or refused)
        return f"child:{self.parent_id}:{self.run}:{self.seq}"


@dataclass(frozen=True)
class CancelRequest:
    """Cancel an execution (a child, when its parent is cancelled).

    ``parent`` (parent id, run, step) is the link a child must carry to be cancelled: an
    explicit child id can be held by an unrelated execution, which a parent never cancels.
    """

    execution_id: str
    parent: tuple[str, int, int] | None = None

    @property
    def key(self) -> str:
        return f"cancel:{self.execution_id}"


@dataclass(frozen=True)
class AdmitRequest:
    """Admit the effect a drive recorded as step document ``doc_id`` (``wf.emit``) to its lane."""

    execution_id: str
    doc_id: str

    @property
    def key(self) -> str:
        return f"admit:{self.execution_id}:{self.doc_id}"


@dataclass(frozen=True)
class SignalRequest:
    """Send signal ``name`` to ``target`` for step ``seq`` of ``execution_id`` (``wf.signal_external``);
    ``signal_id`` lets the receiver record it once however often it is sent."""

    execution_id: str
    seq: int
    run: int
    target: str
    name: str
    value: Any
    signal_id: str

    @property
    def key(self) -> str:
        return f"signal:{self.signal_id}"


#: what a committed drive asks the engine to carry out (docs/architecture.md §6)
Send = ActivityRequest | ClockRequest | ChildRequest | CancelRequest | AdmitRequest | SignalRequest


class Dispatcher(Protocol):
    def send_activity(self, request: ActivityRequest) -> None: ...

    # optional: ``keeps(request) -> bool``, asked by a drive before its commit. True: the
    # dispatcher will run ``request`` in this process right after the commit (an eager activity),
    # so the commit takes its first attempt's lease (``ActivityRequest.holder``) and the attempt
    # begins without a write of its own; a process killed before it starts is then recovered
    # when that lease lapses, not after the activity queue timeout.

    def send_drive(self, execution_id: str, countdown: float | None = None) -> None: ...

    def send_clock(self, request: ClockRequest) -> None:
        """Fire at ``request.fire_at`` if you can (a countdown); beat's scan is the safety net."""
        ...

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        """Deliver one outbox row's message to a worker that runs its handler."""
        ...


class InlineDispatcher:
    """Queues work and runs it when :meth:`run_until_idle` is called (tests, no broker)."""

    def __init__(self, eager: bool = False) -> None:
        self.queue: deque[tuple[str, Any]] = deque()
        self.sent: list[tuple[str, Any]] = []
        self.handlers: dict[str, Callable[[Any], None]] = {}
        #: as a worker with eager activities: the first activity a commit schedules has its
        #: first attempt's lease taken by that commit (``keeps``) and is run next
        self.eager = eager

    def keeps(self, request: ActivityRequest) -> bool:
        return self.eager

    def send_activity(self, request: ActivityRequest) -> None:
        if request.holder is not None:  # run it next, as the committing worker would
            self.queue.appendleft(("activity", request))
            self.sent.append(("activity", request))
            return
        self._put("activity", request)

    def send_drive(self, execution_id: str, countdown: float | None = None) -> None:
        self._put("drive", execution_id)

    def send_clock(self, request: ClockRequest) -> None:
        self._put("clock", request)

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        self._put("effect", ref)

    def _put(self, kind: str, item: Any) -> None:
        self.queue.append((kind, item))
        self.sent.append((kind, item))

    def run_some(self, count: int) -> int:
        """Run at most ``count`` queued items; return how many ran."""
        ran = 0
        while self.queue and ran < count:
            kind, item = self.queue.popleft()
            handler = self.handlers.get(kind)
            if handler is not None:
                handler(item)
            ran += 1
        return ran

    def run_until_idle(self, limit: int = 100_000) -> int:
        """Run queued work (and what it queues) until nothing is left; return how many ran."""
        ran = 0
        while self.queue:
            if ran >= limit:
                raise RuntimeError("InlineDispatcher: too much work, is something looping?")
            kind, item = self.queue.popleft()
            handler = self.handlers.get(kind)
            if handler is not None:
                handler(item)
            ran += 1
        return ran
