"""Run an engine's work in-process: drives and activities from an :class:`InlineDispatcher`.

Used by engine unit tests and by :mod:`celery_durable.testing`; the Celery glue replaces it
with real tasks on real workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import NonRetryableError
from .dispatcher import ActivityRequest, InlineDispatcher

if TYPE_CHECKING:
    from .core import Engine

__all__ = ["LocalWorker"]


class LocalWorker:
    """Executes queued drives and activities synchronously, in order."""

    def __init__(self, engine: Engine, dispatcher: InlineDispatcher, max_attempts: int = 1) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.max_attempts = max_attempts
        #: activity executions that actually ran user code, in order
        self.executed: list[tuple[str, int, str]] = []
        dispatcher.handlers["drive"] = self._drive
        dispatcher.handlers["activity"] = self._activity
        dispatcher.handlers["clock"] = self._clock

    def _drive(self, execution_id: Any) -> None:
        self.engine.drive(str(execution_id))

    def _activity(self, req: ActivityRequest) -> None:
        eng = self.engine
        attempt, _why = eng.activities.begin(req.execution_id, req.seq, req.run)
        if attempt is None:
            return
        act = eng.registry.activity(req.name)
        if act is None:
            err = NonRetryableError(f"activity {req.name!r} is not registered here")
            eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=err))
            return
        args, kwargs = act.codec.decode_args({"args": req.args, "kwargs": req.kwargs})
        self.executed.append((req.execution_id, req.seq, req.name))
        try:
            value = act.codec.encode_result(act.fn(*args, **kwargs))
        except Exception as exc:
            if attempt.number < self.max_attempts and not isinstance(exc, NonRetryableError):
                eng.activities.retrying(attempt, 0.0, exc)
                self.dispatcher.send_activity(req)
                return
            eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=exc))
            return
        eng.activities.complete(attempt, eng.activities.result_doc(attempt, value=value))

    def _clock(self, req: Any) -> None:
        # The inline dispatcher has no countdown: a clock fires only once the (fake) time is
        # due, through fire_due_clocks — exactly the beat path.
        pass

    def run(self) -> int:
        return self.dispatcher.run_until_idle()
