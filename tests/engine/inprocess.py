"""One in-process worker for engine tests: an engine, an inline dispatcher and a ``LocalWorker``
over a store, on a fake clock (or the real one), with helpers to declare and drive workflows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.documents.model import Clock
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.registry import WorkflowDef
from celery_durable.engine.replay.context import require_context
from celery_durable.stores.base import Doc, Store
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import FakeClock

__all__ = ["InProcess", "FakeClock", "parent_and_child"]


class InProcess:
    """``step_time``: how far the fake clock moves before each :meth:`run`, so every stage happens
    at its own time as on real workers (0: time stands still unless a test moves it)."""

    def __init__(
        self,
        store: Store | None = None,
        registry: Registry | None = None,
        clock: Clock | None = None,
        step_time: float = 0.0,
    ) -> None:
        self.store = store or MemoryStore()
        self.clock = clock or FakeClock(1_700_000_000.0)
        self.dispatcher = InlineDispatcher()
        self.registry = registry or Registry()
        self.engine = Engine(self.store, self.dispatcher, self.registry, clock=self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher)
        self.step_time = step_time

    def activity(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` as an activity; the returned function calls it durably in a workflow."""
        act = self.registry.add_activity(fn.__name__, fn)

        def call(*args: Any, **kwargs: Any) -> Any:
            return require_context("activity").call_activity(act.name, act.codec, args, kwargs).result()

        return call

    def workflow(self, fn: Callable[..., Any], signals: dict[str, Any] | None = None) -> WorkflowDef:
        return self.registry.add_workflow(fn.__name__, fn, signals)

    def child(self, definition: WorkflowDef, *args: Any) -> Any:
        return require_context("child").start_child(definition, args, {}, None).result()

    def start(self, definition: WorkflowDef, *args: Any, wid: str | None = None) -> str:
        eid, _ = self.engine.start(definition, args, {}, workflow_id=wid)
        self.run()
        return eid

    def run(self) -> None:
        if self.step_time and isinstance(self.clock, FakeClock):
            self.clock.advance(self.step_time)
        self.worker.run()

    def finish(self, rounds: int = 6, hours: float = 1.0) -> None:
        """Run on as workers and beat would: each round ``hours`` later, due timers fired and the
        recovery scan run (a child's end reported, a lost message re-sent)."""
        assert isinstance(self.clock, FakeClock)
        for _ in range(rounds):
            self.clock.advance(3600 * hours)
            self.engine.timers.fire_due_clocks()
            self.engine.recovery.scan()
            self.run()

    def ex(self, eid: str) -> Doc:
        return self.engine.read_exec(eid)

    def status(self, eid: str) -> str:
        return str(self.ex(eid)["status"])

    def ids(self, eid: str) -> set[str]:
        return {d["id"] for d in self.store.query_partition(eid).docs}


def parent_and_child(env: InProcess, ran: list[str]) -> WorkflowDef:
    """A parent that starts a child running one activity (``ran`` records each order it ships)."""

    @env.activity
    def ship(order: str) -> str:
        ran.append(order)
        return "ok"

    def shipping(order: str) -> str:
        return str(ship(order))

    child_def = env.workflow(shipping)

    def parent(order: str) -> str:
        ctx = require_context("parent")
        return str(ctx.start_child(child_def, (order,), {}, None).result())

    return env.workflow(parent)
