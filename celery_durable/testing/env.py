"""A workflow test environment with time skipping (like Temporal's ``WorkflowEnvironment``).

Everything runs in-process on a fake clock: drives and activities execute synchronously, and
when the workflow waits for a timer the clock jumps straight to it. A workflow that sleeps 30
days, or waits 2 days for a signal that never comes, completes in milliseconds, without
``time.sleep``. Timers fire through the same path as beat's clock scan.

>>> env = WorkflowEnvironment(durable)
>>> handle = env.start(fulfil_order, order)
>>> env.signal(handle, "approval", Approval(ok=True))
>>> env.result(handle)
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.core import Engine
from ..engine.dispatcher import InlineDispatcher
from ..engine.local import LocalWorker
from ..engine.model import Settings
from ..engine.registry import Registry
from ..errors import DurableError
from ..handle import WorkflowHandle
from ..stores.base import Store
from ..stores.memory import MemoryStore

if TYPE_CHECKING:
    from ..app import Durable, Workflow

__all__ = ["FakeClock", "WorkflowEnvironment"]

R = TypeVar("R")


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float | None = None) -> None:
        self.t = time.time() if start is None else start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.t += seconds


class WorkflowEnvironment:
    """In-process engine on a fake clock. Pass a :class:`Durable` (its workflows) or a registry."""

    def __init__(
        self,
        durable: Durable | Registry | None = None,
        *,
        store: Store | None = None,
        start: datetime | float | None = None,
        activity_attempts: int = 1,
    ) -> None:
        if isinstance(start, datetime):
            start = start.timestamp()
        self.clock = FakeClock(start)
        registry = durable if isinstance(durable, Registry) else (durable.registry if durable else Registry())
        self.dispatcher = InlineDispatcher()
        self.store = store or MemoryStore()
        # the app's own settings (attempts, timeouts, grace periods), as its workers would run
        settings = durable.settings if durable is not None and not isinstance(durable, Registry) else Settings()
        self.engine = Engine(self.store, self.dispatcher, registry, settings, self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher, max_attempts=activity_attempts)
        # library signals (celery_durable.signals) fire here as they do on workers
        from ..signals.receivers import forward_event

        self.engine.subscribe(forward_event)

    # --- driving -------------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Run every queued drive and activity (and what they queue)."""
        self.worker.run()

    def advance(self, delta: timedelta | float) -> None:
        """Move the clock forward, fire what became due, and run."""
        self.clock.advance(delta.total_seconds() if isinstance(delta, timedelta) else float(delta))
        self._scan()

    def skip_to_next_timer(self) -> bool:
        """Jump to the earliest pending timer and fire it; False when there is none."""
        nxt = self.engine.links.next_clock()
        if nxt is None:
            return False
        self.clock.t = max(self.clock.t, nxt)
        self._scan()
        return True

    def _scan(self) -> None:
        """What beat does when time passes: fire due timers, re-send due effects (retries)."""
        self.engine.links.fire_due_clocks()
        self.worker.release_due()
        self.engine.outbox.scan()
        self.run_until_idle()

    # --- client side -----------------------------------------------------------------------

    def start(
        self, workflow: Workflow[Any, R], *args: Any, _workflow_id: str | None = None, **kwargs: Any
    ) -> WorkflowHandle[R]:
        eid, _ = self.engine.start(workflow.definition, args, kwargs, workflow_id=_workflow_id)
        self.run_until_idle()
        return WorkflowHandle(self.engine, eid, workflow.definition)

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        """A handle to an execution of this environment."""
        return WorkflowHandle(self.engine, workflow_id)

    def signal(self, handle: WorkflowHandle[Any] | str, name: str, value: Any) -> bool:
        ok = self.engine.signal(handle if isinstance(handle, str) else handle.id, name, value)
        self.run_until_idle()
        return ok

    def cancel(self, handle: WorkflowHandle[Any]) -> bool:
        ok = handle.cancel()
        self.run_until_idle()
        return ok

    def result(self, handle: WorkflowHandle[R], max_time: timedelta = timedelta(days=3650)) -> R:
        """Run, skipping time from timer to timer, until the execution ends; return its result."""
        limit = self.clock.t + max_time.total_seconds()
        self.run_until_idle()
        while not handle.poll().done:
            if self.clock.t > limit or not self.skip_to_next_timer():
                raise DurableError(
                    f"execution {handle.id!r} is still {handle.status()} and nothing is scheduled: "
                    "it waits for a signal or an external event"
                )
        return handle.result(timeout=0)
