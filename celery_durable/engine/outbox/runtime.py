"""The worker side of the outbox: handler definitions, the heartbeat, stopping a handler, and
what to do with each attempt's outcome (the semantics of seed ``004``'s ``runOnce``).

A running handler is watched by one heartbeat thread per process (:class:`EffectKeeper`). Every
``cancel_poll`` seconds it re-reads the row: a cancelled row sets the handler's cancel flag
(``effect_context().cancelled()``), wakes ``effect_context().sleep()`` and, unless the handler
was declared ``interruptible=False``, raises :class:`EffectCancelled` inside the handler's
thread (an asynchronous exception: it lands at the next Python bytecode, not inside a blocking C
call). A handler past its ``timeout`` gets :class:`EffectTimeout` the same way, from a thread
that never waits for the store (so a slow renew cannot delay it). Both derive from
``BaseException`` so a user ``except Exception`` cannot swallow them; one that lands while the
handler is inside a library call (``durable.outbox.*``) waits for the call's end and is then
raised even if the call failed. The lease is extended when it runs low; a lease found taken marks
the attempt lost (its settle will be a no-op).
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.activities.interrupts import async_raise
from celery_durable.engine.activities.lease_heartbeat import Heartbeat
from celery_durable.engine.outbox.machine import LEASE_LOST, OutboxEngine
from celery_durable.engine.outbox.model import FAILED, RETRY, SUCCEEDED, Claim
from celery_durable.errors import ConfigurationError, DurableTimeoutError, StoreError
from celery_durable.retry import RetryPolicy

__all__ = [
    "EffectDef",
    "EffectRegistry",
    "EffectContext",
    "EffectKeeper",
    "EffectInterrupt",
    "EffectCancelled",
    "EffectTimeout",
    "EffectLeaseLost",
    "Outcome",
    "UnknownEffectType",
    "effects_of",
    "effect_context",
    "shielded",
    "execute",
]

log = logging.getLogger("celery_durable.outbox")


class EffectInterrupt(BaseException):  # noqa: N818 - control flow, like KeyboardInterrupt
    """Raised inside a running handler to stop it (never caught by ``except Exception``)."""


class EffectCancelled(EffectInterrupt):
    """The effect was cancelled while its handler ran."""


class EffectTimeout(EffectInterrupt):
    """The handler ran longer than its ``timeout``."""


class EffectLeaseLost(EffectInterrupt):
    """Another worker owns the row now (this one was presumed dead): stop, nothing is recorded."""


class UnknownEffectType(ConfigurationError):
    """No handler is registered for this effect type in this process."""


@dataclass(frozen=True)
class EffectDef:
    """A registered handler (``@durable.effect``)."""

    type: str
    fn: Callable[[Any], Any]
    codec: ValueCodec
    replay_safe: bool = True
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    #: status a non-retryable failure is settled as: ``failed`` or ``succeeded`` ("already done")
    non_retryable_status: str = FAILED
    timeout: float | None = None
    interruptible: bool = True
    queue: str | None = None
    task_name: str = ""

    def __post_init__(self) -> None:
        if self.non_retryable_status not in (FAILED, SUCCEEDED):
            raise ConfigurationError("non_retryable_status must be 'failed' or 'succeeded'")
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError("an effect timeout must be > 0 seconds")

    def encode(self, payload: Any) -> Any:
        """Validate a payload against the handler's declared type (in the enqueuer)."""
        return self.codec.encode(payload, f"payload of effect {self.type!r}")


class EffectRegistry:
    def __init__(self) -> None:
        self.defs: dict[str, EffectDef] = {}

    def add(self, definition: EffectDef) -> EffectDef:
        existing = self.defs.get(definition.type)
        if existing is not None and existing.fn is not definition.fn:
            raise ConfigurationError(f"two handlers for effect type {definition.type!r}")
        self.defs[definition.type] = definition
        return definition

    def get(self, effect_type: str) -> EffectDef | None:
        return self.defs.get(effect_type)

    def require(self, effect_type: str) -> EffectDef:
        definition = self.defs.get(effect_type)
        if definition is None:
            known = ", ".join(sorted(self.defs)) or "none"
            raise UnknownEffectType(f"no handler for effect type {effect_type!r} (registered: {known})")
        return definition


_REGISTRIES: weakref.WeakKeyDictionary[object, EffectRegistry] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def effects_of(owner: object) -> EffectRegistry:
    """The effect registry attached to ``owner`` (the engine ``Registry`` of a ``Durable``)."""
    with _registries_lock:
        reg = _REGISTRIES.get(owner)
        if reg is None:
            reg = _REGISTRIES[owner] = EffectRegistry()
        return reg


_current: contextvars.ContextVar[EffectContext | None] = contextvars.ContextVar("celery_durable_effect", default=None)


def effect_context() -> EffectContext:
    """The context of the effect handler running in this thread."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("effect_context() can only be used inside an effect handler")
    return ctx


@contextmanager
def shielded() -> Iterator[None]:
    """Shield library code called from a handler (e.g. ``durable.outbox.cancel``) from interrupts."""
    ctx = _current.get()
    if ctx is None:
        yield
        return
    with ctx.shield():
        yield


class EffectContext:
    """What a handler can know about its attempt; also the guard that lets it be interrupted."""

    def __init__(self, outbox: OutboxEngine, claim: Claim, definition: EffectDef) -> None:
        self.outbox = outbox
        self.claim = claim
        self.definition = definition
        self.deadline = None if definition.timeout is None else time.monotonic() + definition.timeout
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._active = False
        self._interrupted = False
        self._shield = 0
        self._deferred: type[BaseException] | None = None
        self.timed_out = False
        #: the handler returned, raised or will not run: nothing is left to stop or renew, and the
        #: settle owns the claim (a claim it settled is marked lost, yet nobody took it)
        self.finished = False

    @property
    def effect_id(self) -> str:
        return self.claim.effect_id

    @property
    def key(self) -> str:
        return self.claim.key

    @property
    def effect_type(self) -> str:
        return self.claim.type

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def max_attempts(self) -> int:
        """The attempts this effect gets in all (the row's and the retry policy's limit)."""
        return min(self.claim.max_attempts, self.definition.policy.maximum_attempts)

    @property
    def will_retry(self) -> bool:
        """Whether a retryable failure of this attempt gets another one (False on the last: the
        place to compensate)."""
        return self.claim.attempt < self.max_attempts

    @property
    def lease_lost(self) -> bool:
        """Another worker took the row: this attempt's outcome will not be recorded."""
        return self.claim.lost and not self.claim.cancelled

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        """Raise :class:`EffectCancelled` if the effect was cancelled."""
        if self._cancel.is_set():
            raise EffectCancelled(f"effect {self.effect_id!r} was cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake up (raising :class:`EffectCancelled`) as soon as the effect is cancelled."""
        if self._cancel.wait(max(0.0, seconds)):
            raise EffectCancelled(f"effect {self.effect_id!r} was cancelled")

    # --- used by the heartbeat ---------------------------------------------------------------

    def mark_cancelled(self) -> None:
        self._cancel.set()
        if self.definition.interruptible:
            self._interrupt(EffectCancelled)

    def time_out(self) -> None:
        self.timed_out = True
        self._interrupt(EffectTimeout)

    def time_out_if_due(self, now: float) -> bool:
        """Time the handler out if its deadline passed (once; no I/O: safe on any thread)."""
        with self._lock:
            if self.deadline is None or self.timed_out or now < self.deadline:
                return False
            self.timed_out = True
        self._interrupt(EffectTimeout)
        return True

    def mark_lost(self) -> None:
        """The lease is gone (D3): stop the handler as a cancel does (its outcome is not recorded)."""
        self._cancel.set()
        if self.definition.interruptible:
            self._interrupt(EffectLeaseLost)

    def _interrupt(self, exc_type: type[BaseException]) -> None:
        with self._lock:
            if self._active and not self._interrupted and self._thread is not None:
                self._interrupted = True
                if self._shield:
                    self._deferred = exc_type  # raised when the library call returns
                else:
                    async_raise(self._thread, exc_type)

    @contextmanager
    def shield(self) -> Iterator[None]:
        """No interrupt lands inside this block (library code); one due is raised at its end."""
        with self._lock:
            self._shield += 1
        try:
            yield
        except Exception as exc:
            # the call failed while an interrupt waited for it: the interrupt wins (it is the only
            # one this attempt gets), chained to the call's error; a handler catching that error
            # must not swallow the timeout or cancel with it
            deferred = self._unshield()
            if deferred is not None:
                raise deferred(f"effect {self.effect_id!r} interrupted") from exc
            raise
        except BaseException:
            self._unshield()  # KeyboardInterrupt, SystemExit, an interrupt: already stopping
            raise
        deferred = self._unshield()
        if deferred is not None:
            raise deferred(f"effect {self.effect_id!r} interrupted")

    def _unshield(self) -> type[BaseException] | None:
        """Leave one shield level; the interrupt deferred meanwhile, if this was the outermost."""
        with self._lock:
            self._shield -= 1
            deferred = self._deferred if self._shield == 0 else None
            if deferred is not None:
                self._deferred = None
            return deferred

    # --- the guard around the handler call ----------------------------------------------------

    def __enter__(self) -> EffectContext:
        self._token = _current.set(self)
        with self._lock:
            self._thread = threading.get_ident()
            self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active = False
            self.finished = True
            if self._interrupted and self._thread is not None:
                async_raise(self._thread, None)  # drop an interrupt that has not landed yet
        _current.reset(self._token)


class _Deadlines:
    """Times handlers out at their deadline on a thread of its own that never does I/O: the
    heartbeat renews leases one store call after another, and one slow call (another handler's
    renew on a throttled or locked store) must not hold a timeout back. Renewals stay on the
    heartbeat's one thread; this one runs only while a tracked handler has a deadline ahead and
    then ends by itself (so there is nothing to stop at shutdown)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._contexts: dict[int, EffectContext] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, ctx: EffectContext) -> None:
        if ctx.deadline is None or ctx.timed_out:
            return
        with self._cond:
            self._contexts[id(ctx)] = ctx
            thread = self._thread
            if thread is None or not thread.is_alive() or self._pid != os.getpid():  # or lost in a fork
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()  # re-plan: this deadline may be the earliest

    def remove(self, ctx: EffectContext) -> None:
        with self._cond:
            self._contexts.pop(id(ctx), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [c for c in self._contexts.values() if c.deadline is not None and c.deadline <= now]
                for ctx in due:
                    del self._contexts[id(ctx)]
                ahead = [c.deadline for c in self._contexts.values() if c.deadline is not None]
                if not due:
                    if not ahead:
                        self._thread = None  # under the lock: the next add starts a new thread
                        return
                    self._cond.wait(min(ahead) - now)
                    continue
            for ctx in due:  # outside the lock: an add or remove never waits for an interrupt
                try:
                    ctx.time_out_if_due(now)
                except Exception:  # the other handlers' deadlines must outlive any one failure
                    log.exception("timing out effect %s failed", ctx.effect_id)


class EffectKeeper:
    """The running handlers of this process; a beater of a :class:`~..heartbeat.Heartbeat` (the
    engine's, shared with activity leases; or its own when built alone) that renews their leases
    and notices cancellations every ``poll`` seconds. Timeouts fire at their deadline on a thread
    of their own (:class:`_Deadlines`), never behind a store call."""

    def __init__(self, poll: float = 1.0, heartbeat: Heartbeat | None = None) -> None:
        self.poll = poll
        self._lock = threading.Lock()
        self._running: dict[int, EffectContext] = {}
        self._last_beat = 0.0
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat("celery-durable-effects")
        self.heartbeat.add(self)
        self._deadlines = _Deadlines("celery-durable-deadlines")

    def track(self, ctx: EffectContext) -> None:
        with self._lock:
            if not self._running:
                self._last_beat = time.monotonic()
            self._running[id(ctx)] = ctx
        self._deadlines.add(ctx)
        self.heartbeat.wake()

    def untrack(self, ctx: EffectContext) -> None:
        with self._lock:
            self._running.pop(id(ctx), None)
        self._deadlines.remove(ctx)

    def running(self) -> list[EffectContext]:
        with self._lock:
            return list(self._running.values())

    def next_beat(self, now: float) -> float | None:
        contexts = self.running()
        if not contexts:
            return None
        at = self._last_beat + self.poll
        for ctx in contexts:
            # a handler already timed out is not waited for again (its interrupt is on its way):
            # otherwise the deadline stays in the past and the heartbeat would spin
            if ctx.deadline is not None and not ctx.timed_out:
                at = min(at, ctx.deadline)
        return at

    def beat(self) -> None:
        """Check every running handler once: every due timeout first (no I/O), then each one's
        cancellation and lease (a store call each)."""
        self._last_beat = now = time.monotonic()
        contexts = self.running()
        for ctx in contexts:
            ctx.time_out_if_due(now)
        for ctx in contexts:
            if ctx.finished:
                continue  # its settle owns the claim now: a renew would only wait behind it
            try:
                state = ctx.outbox.renew(ctx.claim)
            except StoreError as exc:  # keep beating; the lease may still be ours next time
                log.warning("heartbeat of effect %s failed: %s", ctx.effect_id, exc)
                continue
            if ctx.finished or ctx.cancelled():
                # finished: settled meanwhile (the settle marks its claim lost, yet nobody took it)
                continue
            if state == "cancelled":
                log.info("effect %s was cancelled while running: stopping its handler", ctx.effect_id)
                ctx.mark_cancelled()
            elif state == "lost":
                log.warning("effect %s: another worker owns it now: stopping its handler", ctx.effect_id)
                ctx.mark_lost()


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery.

    ``kind``: succeeded | failed | retry (pending again: send it after ``delay``) | cancelled |
    lease-lost (another worker owns the row: nothing was written) | unsettled (the store failed
    twice: the lease will lapse and the scan decides).
    """

    kind: str
    delay: float = 0.0
    error: BaseException | None = None
    #: a settle failed after the handler ran and the row was put back to pending
    requeued: bool = False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


#: a claim older than this when its handler starts is re-read for a cancel first (a fresh one
#: was proved pending and uncancelled by its own etag-guarded write a moment ago)
PRECHECK_AFTER = 0.05


def execute(
    outbox: OutboxEngine, claim: Claim, definition: EffectDef, keeper: EffectKeeper, claim_next: Collection[str] = ()
) -> Outcome:
    """Run the handler for a claimed row and settle the outcome (under lease ownership).

    With ``claim_next`` (effect types this worker runs) a settle that ends the row also claims the
    key's next row for this worker when it is due now: it is then ``claim.successor``."""
    ctx = EffectContext(outbox, claim, definition)
    keeper.track(ctx)
    try:
        return _execute(outbox, ctx, definition, claim_next)
    finally:
        keeper.untrack(ctx)


def _stopped(outbox: OutboxEngine, claim: Claim) -> Outcome:
    """The handler did not run to its end, or its outcome is not ours to record."""
    if claim.cancelled:
        return Outcome(outbox.release(claim))  # the key was held until now (D1)
    return Outcome(LEASE_LOST)


def _execute(outbox: OutboxEngine, ctx: EffectContext, definition: EffectDef, claim_next: Collection[str]) -> Outcome:
    claim = ctx.claim
    if outbox.clock.now() - claim.claimed_at > PRECHECK_AFTER:
        try:
            state = outbox.renew(claim)
        except StoreError as exc:
            # never run blind: put the row back (the lease lapses if even that fails)
            log.warning("effect %s: cancel check failed (%s); requeued without running", claim.effect_id, exc)
            ctx.finished = True
            return _settle_failed(outbox, claim, exc, requeue=True)
        if state != "ok":
            ctx.finished = True
            return _stopped(outbox, claim)
    error: BaseException | None = None
    try:
        payload = definition.codec.decode(claim.payload, f"payload of effect {claim.type!r}")
        with ctx:
            definition.fn(payload)
    except EffectLeaseLost:
        return _stopped(outbox, claim)
    except EffectCancelled as exc:
        if ctx.cancelled() or claim.cancelled or claim.lost:
            log.info("effect %s stopped: %s", claim.effect_id, "cancelled" if claim.cancelled else "lease lost")
            return _stopped(outbox, claim)
        error = exc
    except EffectTimeout:
        error = DurableTimeoutError(f"effect {claim.type!r} timed out after {definition.timeout}s")
    except Exception as exc:
        error = exc
    ctx.finished = True  # set on leaving the handler; here too when its payload did not decode
    if error is None:
        try:
            return Outcome(outbox.settle(claim, SUCCEEDED, claim_next=claim_next))
        except StoreError as exc:
            # seed: a replay-safe effect is requeued, a process-bound one terminalized
            return _settle_failed(outbox, claim, exc, requeue=claim.replay_safe)
    text = _describe(error)
    policy = definition.policy
    if policy.non_retryable and isinstance(error, policy.non_retryable):
        verb = definition.non_retryable_status
    elif not ctx.will_retry:
        verb = FAILED
    else:
        verb = RETRY
    log.warning("effect %s (%s) attempt %d failed (%s): %s", claim.effect_id, claim.type, claim.attempt, verb, text)
    try:
        if verb == RETRY:
            delay = jittered(policy.delay(claim.attempt).total_seconds())
            kind = outbox.settle(claim, RETRY, error=text, delay=delay)
            return Outcome(kind, delay=delay if kind == RETRY else 0.0, error=error)
        reason = None if verb != FAILED or claim.attempt < claim.max_attempts else f"attempts exhausted: {text}"
        return Outcome(outbox.settle(claim, verb, error=text, reason=reason, claim_next=claim_next), error=error)
    except StoreError as exc:
        return _settle_failed(outbox, claim, exc, requeue=verb == RETRY)


def jittered(delay: float) -> float:
    """A retry delay with jitter, so retries of many failed effects do not arrive together.

    Celery's ``retry_jitter`` draws from [0, delay] in whole seconds
    (``celery.utils.time.get_exponential_backoff_interval``); our delays start at 100 ms, so this
    draws from [delay/2, delay] instead: spread, but never an immediate retry."""
    return delay * (0.5 + random.random() / 2) if delay > 0 else 0.0


def _settle_failed(outbox: OutboxEngine, claim: Claim, exc: StoreError, requeue: bool) -> Outcome:
    try:
        if requeue:
            text = f"Worker failed before settling the claimed effect: {_describe(exc)}"
            kind = outbox.settle(claim, RETRY, error=text, delay=0.0)
            log.warning("effect %s: %s (%s)", claim.effect_id, text, "requeued" if kind == RETRY else kind)
            return Outcome(kind, error=exc, requeued=kind == RETRY)
        text = f"Worker failed to settle a process-bound effect after execution started: {_describe(exc)}"
        kind = outbox.settle(claim, FAILED, error=text, reason=text)
        log.error("effect %s: %s (%s)", claim.effect_id, text, "terminalized" if kind == FAILED else kind)
        return Outcome(kind, error=exc)
    except StoreError as again:
        log.error("effect %s not settled (%s): its lease lapses and the scan decides", claim.effect_id, again)
        return Outcome("unsettled", error=again)
