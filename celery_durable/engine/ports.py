"""What the engine's components see of the engine: typed ports, so none of them imports ``core``.

``core.Engine`` builds the driver, the activity runner, timers, signals, children, recovery and leases and hands
each of them itself; they only need the members below. Typing them against these protocols
keeps the import graph one way (``core`` → components → ``parts``), with no circles
(docs/architecture.md §3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from celery_durable.engine.activities.context import ActivityContext
    from celery_durable.engine.activities.stalls import Stalls
    from celery_durable.engine.dispatcher import Dispatcher, Send
    from celery_durable.engine.documents.model import Attempt, Clock
    from celery_durable.engine.documents.records import ExecDoc
    from celery_durable.engine.drive.partition_cache import PartitionCache
    from celery_durable.engine.limits.leaving import Leaving
    from celery_durable.engine.registry import Registry
    from celery_durable.observability import Counters
    from celery_durable.settings import Settings
    from celery_durable.stores.base import Doc, Rewrite, Store

__all__ = ["EngineParts", "DriverPort", "ChildrenPort", "SignalsPort", "LeasesPort", "LimitsPort"]


class DriverPort(Protocol):
    def drive(
        self,
        execution_id: str,
        carry: Sequence[Doc] = (),
        release: Sequence[int] = (),
        trust_cache: float = 0.0,
        *,
        tokens: Mapping[int, str | None] | None = None,
        defer: bool = False,
        timing_out: bool = False,
        also: Sequence[Rewrite] = (),
    ) -> str: ...

    def fail_corrupt(self, execution_id: str, error: Exception) -> None: ...


class ChildrenPort(Protocol):
    def notify_parent(self, child_id: str) -> None: ...

    def check_child(self, parent_id: str, marker: Doc) -> None: ...

    def fence_children(self, parent: Mapping[str, Any], markers: list[Doc]) -> None: ...


class SignalsPort(Protocol):
    def signal(
        self,
        execution_id: str,
        name: str,
        value: Any,
        signal_id: str | None = None,
        sender: dict[str, Any] | None = None,
        by: str | None = None,
    ) -> bool: ...

    def after_commit(self, execution_id: str, new_docs: list[Doc]) -> None: ...


class LimitsPort(Protocol):
    def enter(
        self, execution_id: str, run: int, seq: int, number: int, record: Mapping[str, Any], token: str | None = None
    ) -> str | None: ...

    def leave(self, attempt: Attempt) -> None: ...

    def leaving(self, attempt: Attempt) -> Leaving | None: ...

    def release_grant(
        self, lpk: str, execution_id: str, run: int, seq: int, attempt: tuple[int, str | None]
    ) -> None: ...

    def left(self, out: Leaving) -> None: ...

    def release(
        self, execution_id: str, run: int, seq: int, attempt: tuple[int, str | None], record: Mapping[str, Any]
    ) -> None: ...

    def admit(self, sends: list[Send]) -> list[Send]: ...

    def release_idle(self, execution_id: str, run: int) -> None: ...

    def scan(self, limit: int = 500) -> int: ...

    def join(self, record: Mapping[str, Any], waiter: dict[str, Any]) -> bool | None: ...

    def withdraw(self, record: Mapping[str, Any], step: str) -> None: ...

    def queue_execution(self, execution_id: str, record: Mapping[str, Any]) -> None: ...

    def take_turn(self, ex: Mapping[str, Any]) -> None: ...

    def release_execution(self, ex: Mapping[str, Any]) -> None: ...

    def hold_execution(self, ex: Mapping[str, Any]) -> None: ...


class TimersPort(Protocol):
    def fire_deadline(self, execution_id: str) -> Any: ...


class LeasesPort(Protocol):
    def track(self, attempt: Attempt) -> None: ...

    def untrack(self, attempt: Attempt) -> ActivityContext | None: ...

    def watch(self, ctx: ActivityContext) -> None: ...

    def latest_details(self, attempt: Attempt) -> Any: ...

    @property
    def stalls(self) -> Stalls: ...


class EngineParts(Protocol):
    """The shared state and the collaborators of one engine."""

    store: Store
    dispatcher: Dispatcher
    registry: Registry
    settings: Settings
    clock: Clock
    cache: PartitionCache
    counters: Counters
    identity: Callable[[], str]

    @property
    def driver(self) -> DriverPort: ...

    @property
    def children(self) -> ChildrenPort: ...

    @property
    def signals(self) -> SignalsPort: ...

    @property
    def leases(self) -> LeasesPort: ...

    @property
    def limits(self) -> LimitsPort: ...

    @property
    def timers(self) -> TimersPort: ...

    def emit(self, event: str, **kwargs: Any) -> None: ...

    def dispatch(self, send: Send) -> None: ...

    def cancel(
        self, execution_id: str, by: str | None = None, reason: str | None = None, from_parent: bool = False
    ) -> bool: ...

    def reopen_child(self, child_id: str, parent_id: str) -> None: ...

    def wake(self, execution_id: str) -> None: ...

    def create_execution(
        self,
        workflow: str,
        payload: dict[str, Any],
        eid: str,
        parent: dict[str, Any] | None,
        *,
        deadline_at: float | None = None,
        **fields: Any,
    ) -> bool: ...

    def read_exec(self, execution_id: str) -> ExecDoc: ...
