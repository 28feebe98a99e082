"""Run an engine's work in-process: drives, activities and effects from an :class:`InlineDispatcher`.

Used by engine unit tests and by :mod:`celery_durable.testing`; the Celery glue replaces it
with real tasks on real workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.context import ActivityInterrupt
from celery_durable.engine.activities.delivery import Delivery
from celery_durable.engine.dispatcher import ActivityRequest, InlineDispatcher
from celery_durable.engine.outbox.model import RETRY, EffectRef
from celery_durable.engine.outbox.runtime import EffectContext, EffectKeeper, effects_of, execute
from celery_durable.errors import NonRetryableError

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine

__all__ = ["LocalWorker"]


class InlineKeeper(EffectKeeper):
    """Tracks running handlers without a heartbeat thread: in-process, a handler runs to its end
    before anything else happens, so its lease cannot lapse unless the test moves the clock."""

    def track(self, ctx: EffectContext) -> None:
        with self._lock:
            self._running[id(ctx)] = ctx


class LocalWorker:
    """Executes queued drives, activities and outbox effects synchronously, in order."""

    def __init__(self, engine: Engine, dispatcher: InlineDispatcher, max_attempts: int = 1) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.max_attempts = max_attempts
        #: activity executions that actually ran user code, in order
        self.executed: list[tuple[str, int, str]] = []
        dispatcher.handlers["drive"] = self._drive
        dispatcher.handlers["activity"] = self._activity
        dispatcher.handlers["clock"] = self._clock
        dispatcher.handlers["effect"] = self._effect
        self.keeper = InlineKeeper()
        #: effect retries waiting for their backoff: (due time, message), what Celery's
        #: ``retry(countdown=...)`` does on a worker
        self.delayed: list[tuple[float, EffectRef]] = []

    def _drive(self, execution_id: Any) -> None:
        self.engine.drive(str(execution_id))

    def _activity(self, req: ActivityRequest) -> None:
        eng = self.engine
        # req.holder: the commit that scheduled it took its lease (an eager dispatcher's ``keeps``)
        attempt, _why = eng.activities.begin(
            req.execution_id, req.seq, req.run, delivery=Delivery.of_request(req), claimed=req.holder
        )
        if attempt is None:
            return
        act = eng.registry.activity(req.name)
        if act is None:
            err = NonRetryableError(f"activity {req.name!r} is not registered here")
            eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=err))
            return
        args, kwargs = act.codec.decode_args({"args": req.args, "kwargs": req.kwargs})
        self.executed.append((req.execution_id, req.seq, req.name))
        actx = eng.activities.context(attempt, act.options)
        try:
            with actx:
                value = act.codec.encode_result(act.fn(*args, **kwargs))
        except (Exception, ActivityInterrupt) as raised:
            exc: BaseException | None = raised
            if isinstance(raised, ActivityInterrupt):  # cancelled (nothing to record), or stalled
                exc = eng.activities.interrupted(attempt, actx, raised)
                if exc is None:
                    return
            assert exc is not None
            if attempt.number < self.max_attempts and not isinstance(exc, NonRetryableError):
                eng.activities.retrying(attempt, 0.0, exc)
                self.dispatcher.send_activity(req)
                return
            if act.options.get("pause_on_failure") and eng.activities.hold(attempt, exc):
                return  # paused, the step held (engine/activities/holds.py)
            eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=exc))
            return
        eng.activities.complete(attempt, eng.activities.result_doc(attempt, value=value))

    def _clock(self, req: Any) -> None:
        # The inline dispatcher has no countdown: a clock fires only once the (fake) time is
        # due, through fire_due_clocks — exactly the beat path.
        pass

    def _effect(self, ref: EffectRef) -> None:
        outbox = self.engine.outbox
        claim = outbox.claim(ref.key, ref.effect_id).claim
        if claim is None:  # not its turn, early, settled: the outbox scan re-sends when due
            return
        definition = effects_of(self.engine.registry).get(claim.type)
        if definition is None:
            outbox.settle(claim, RETRY, error=f"no handler for effect type {claim.type!r}", delay=60.0)
            return
        outcome = execute(outbox, claim, definition, self.keeper)
        if outcome.kind == RETRY:
            self.delayed.append((self.engine.clock.now() + outcome.delay, ref))

    def release_due(self) -> int:
        """Queue the effect retries whose backoff has passed (on the engine's clock)."""
        now = self.engine.clock.now()
        due = [ref for at, ref in self.delayed if at <= now]
        self.delayed = [(at, ref) for at, ref in self.delayed if at > now]
        for ref in due:
            self.dispatcher.send_effect(ref)
        return len(due)

    def run(self) -> int:
        return self.dispatcher.run_until_idle()
