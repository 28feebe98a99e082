"""The effect outbox on Celery (docs/architecture.md §9): ``durable.outbox``, ``@durable.effect``, the
handler tasks and beat's ``celery_durable.outbox_scan``.

>>> @durable.effect("email.send", replay_safe=True, max_attempts=5, non_retryable=(BadAddress,))
... def send_email(msg: Email) -> None: ...
>>> durable.outbox.enqueue("email.send", Email(...), key="user-42", effect_id="welcome-42")

Each handler is a Celery task named ``celery_durable.effect.<type>`` whose message carries only
``(key, effect_id)``. A delivery claims the row (if it is its key's turn), runs the handler and
settles under lease ownership; a retryable failure is settled back to pending with the policy's
delay and re-sent with Celery's own ``Task.retry(countdown=...)``. Settings (``app.conf``):

=====================================  =========  ===============================================
``durable_outbox_scan_interval``       5 s        beat: lost messages, due retries, expired leases
``durable_outbox_retention``           7 days     succeeded/cancelled rows are then deleted
``durable_outbox_queue_timeout``       60 s       an unclaimed claimable row is re-sent after this
``durable_outbox_cancel_poll``         1 s        how often a running handler checks for a cancel
``durable_outbox_fast_send_max``       60 s       delays up to this get a countdown message
``durable_outbox_admit_grace``         10 s       an unadmitted intent is admitted by the scan
``durable_outbox_max_lane_backlog``    10,000     live rows per key
``durable_outbox_drain_max``           50         rows of a key one delivery runs back to back
=====================================  =========  ===============================================

Leases use ``durable_lease_ttl`` / ``durable_heartbeat_interval`` like activities.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import keyword
import logging
import re
import threading
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from celery import Celery

from celery_durable.codecs import ValueCodec
from celery_durable.engine.drive import seals
from celery_durable.engine.outbox import (
    Admitted,
    Claim,
    ClaimUnknown,
    EffectRef,
    OutboxEngine,
    OutboxSettings,
    ScanReport,
)
from celery_durable.engine.outbox.model import FAILED, RETRY, adopt_of, intent_id, lane_pk
from celery_durable.engine.outbox.problems import EffectInfo, Problems, StuckLane
from celery_durable.engine.outbox.runtime import (
    EffectCancelled,
    EffectContext,
    EffectDef,
    EffectLeaseLost,
    EffectRegistry,
    EffectTimeout,
    effect_context,
    effects_of,
    execute,
    shielded,
)
from celery_durable.engine.outcomes import ClaimOutcome
from celery_durable.errors import (
    ConfigurationError,
    DurableTimeoutError,
    IdempotencyConflict,
    LaneFull,
    OperationRefused,
    StoreError,
    StoreUnavailable,
)
from celery_durable.glue.beat_scans import outbox_pass
from celery_durable.glue.pools import effect_refusal, time_limit
from celery_durable.glue.session_tokens import header, retry_stale, session_headers, use_session
from celery_durable.glue.wire import WireTask, serializer
from celery_durable.retry import RetryPolicy
from celery_durable.stores.base import Doc, Op

if TYPE_CHECKING:
    from celery_durable.glue.extension import DurableLike

__all__ = [
    "Outbox",
    "EffectInfo",
    "EffectSpec",
    "Problems",
    "StuckLane",
    "IdempotencyConflict",
    "LaneFull",
    "EffectContext",
    "EffectCancelled",
    "EffectTimeout",
    "EffectLeaseLost",
    "effect_context",
    "OUTBOX_SCAN_TASK",
    "EFFECT_TASK_PREFIX",
]

log = logging.getLogger("celery_durable.outbox")

OUTBOX_SCAN_TASK = "celery_durable.outbox_scan"
EFFECT_TASK_PREFIX = "celery_durable.effect."
#: a message header: the ids of the rows enqueued right after the message's row (a read hint)
AFTER_HEADER = "durable_fx_after"
#: a retry's header: [[owners], attempt] of its claim whose outcome is unknown (``ClaimUnknown.owners``)
ADOPT_HEADER = "durable_fx_adopt"
ADOPT_SEAL_HEADER = "durable_fx_adopt_seal"

F = TypeVar("F", bound=Callable[..., Any])


P = ParamSpec("P")
R = TypeVar("R")


def _shielded(method: Callable[P, R]) -> Callable[P, R]:
    """Client API called from inside a handler: a cancel interrupt never lands mid-call."""

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with shielded():
            return method(*args, **kwargs)

    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = method.__name__, method.__doc__, method  # type: ignore[attr-defined]
    return wrapper


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(frozen=True)
class EffectSpec:
    """One effect of :meth:`Outbox.enqueue_many` (the arguments of :meth:`Outbox.enqueue`)."""

    type: str
    payload: Any = None
    key: str | None = None
    effect_id: str | None = None
    available_at: datetime | float | None = None
    delay: timedelta | float | None = None


class CeleryEffectSender:
    """Sends one row's message: its handler task with ``(key, effect_id)``, glue/wire.py's serializer."""

    def __init__(self, app: Celery, effects: EffectRegistry) -> None:
        self.app = app
        self.effects = effects

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        definition = self.effects.get(ref.type)
        options: dict[str, Any] = {
            "task_id": f"effect:{ref.effect_id}",
            "shadow": f"{ref.type} [{ref.key} {ref.effect_id}]",  # what Flower shows
            "serializer": serializer(self.app),
            "ignore_result": True,
        }
        if countdown:
            options["countdown"] = countdown
        if definition is not None and definition.queue:
            options["queue"] = definition.queue
        headers: dict[str, Any] = session_headers(self.app, lane_pk(ref.key))
        if ref.after:  # a hint (a worker without it ignores the header): see EffectRef.after
            headers[AFTER_HEADER] = list(ref.after)
        if headers:
            options["headers"] = headers
        name = definition.task_name if definition is not None else EFFECT_TASK_PREFIX + ref.type
        self.app.send_task(name, args=[ref.key, ref.effect_id], **options)


def _sync(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An ``async def`` handler runs to its end in an event loop of its own, on the task's thread
    (so a cancel or timeout interrupt still reaches it); calling it bare would only create a
    coroutine and settle the row ``succeeded`` with its body never run."""
    if not inspect.iscoroutinefunction(fn):
        return fn

    def run(payload: Any) -> Any:
        return asyncio.run(fn(payload))

    run.__name__, run.__qualname__, run.__wrapped__ = fn.__name__, fn.__qualname__, fn  # type: ignore[attr-defined]
    return run


def _task_function_name(task_name: str) -> str:
    """A Python identifier for the handler task's function (Celery compiles a signature with it)."""
    name = re.sub(r"\W", "_", task_name.rsplit(".", 1)[-1]) or "effect"
    return f"_{name}" if name[0].isdigit() or keyword.iskeyword(name) else name


def _payload_codec(fn: Callable[..., Any]) -> ValueCodec:
    params = [
        p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) != 1:
        raise ConfigurationError(f"an effect handler takes exactly one argument (the payload): {fn!r}")
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward refs: accept anything rather than refuse to run
        hints = {}
    return ValueCodec(hints.get(params[0].name, Any))


class Outbox:
    """``durable.outbox``: enqueue, cancel and inspect effects; run by the handler tasks."""

    def __init__(self, durable: DurableLike) -> None:
        self._durable = durable
        self.effects = effects_of(durable.registry)
        self._lock = threading.Lock()
        self._register_scan_task()

    # --- wiring -------------------------------------------------------------------------------

    @property
    def config(self) -> OutboxSettings:
        """The outbox's view of ``durable.settings`` (the ``durable_outbox_*`` keys)."""
        return OutboxSettings.of(self._durable.settings)

    @property
    def core(self) -> OutboxEngine:
        """The outbox state machine of this process: the engine's own (rebuilt with it)."""
        return self._durable.engine.outbox

    # --- declaring handlers ---------------------------------------------------------------------

    def effect(
        self,
        effect_type: str,
        *,
        replay_safe: bool = True,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        non_retryable: Sequence[type[BaseException]] = (),
        non_retryable_status: str = "failed",
        timeout: float | timedelta | None = None,
        interruptible: bool = True,
        queue: str | None = None,
        name: str | None = None,
    ) -> Callable[[F], F]:
        """Register ``fn(payload)`` as the handler of ``effect_type`` (see ``Durable.effect``)."""
        policy = retry or RetryPolicy()
        if max_attempts is not None:
            policy = dataclasses.replace(policy, maximum_attempts=max_attempts)
        if non_retryable:
            policy = dataclasses.replace(policy, non_retryable=tuple(policy.non_retryable) + tuple(non_retryable))

        def wrap(fn: F) -> F:
            if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
                raise ConfigurationError(f"effect {effect_type!r}: a handler returns, it does not yield ({fn!r})")
            definition = EffectDef(
                type=effect_type,
                fn=_sync(fn),
                codec=_payload_codec(fn),
                replay_safe=replay_safe,
                policy=policy,
                non_retryable_status=non_retryable_status,
                timeout=None if timeout is None else _seconds(timeout),
                interruptible=interruptible,
                queue=queue,
                task_name=name or EFFECT_TASK_PREFIX + effect_type,
            )
            self.effects.add(definition)
            self._register_task(definition)
            return fn

        return wrap

    def _register_task(self, definition: EffectDef) -> None:
        outbox = self

        def run(task: Any, key: str, effect_id: str) -> str:
            # a backstop for workers the bootstep did not check: refuse before the claim (the row
            # stays pending, the scan re-sends it to a worker that can stop its handler)
            refusal = effect_refusal(definition)
            if refusal is not None:
                raise ConfigurationError(refusal)
            return outbox.deliver(task, key, effect_id)

        run.__name__ = run.__qualname__ = _task_function_name(definition.task_name)
        options: dict[str, Any] = {
            "name": definition.task_name,
            "bind": True,
            "ignore_result": True,
            "max_retries": None,
            "base": WireTask,
            "shared": False,
            "typing": False,
        }
        if definition.timeout is not None:  # hard backstop if the interrupt cannot land (C code)
            options["time_limit"] = definition.timeout + max(10.0, definition.timeout)
        if definition.queue:
            options["queue"] = definition.queue
        self._durable.app.task(**options)(run)

    def _register_scan_task(self) -> None:
        def outbox_scan() -> dict[str, int]:
            return dataclasses.asdict(outbox_pass(self))

        self._durable.app.task(base=WireTask, name=OUTBOX_SCAN_TASK, ignore_result=True, shared=False)(outbox_scan)

    # --- the handler task -------------------------------------------------------------------------

    def deliver(self, task: Any, key: str, effect_id: str) -> str:
        """One delivery of a row's message: claim, run, settle; Celery retries a retryable failure."""
        core = self.core
        use_session(core.store, task.request, lane_pk(key))
        after = header(task.request, AFTER_HEADER)
        after = [str(i) for i in after] if isinstance(after, list) else []
        raw, mac = header(task.request, ADOPT_HEADER), header(task.request, ADOPT_SEAL_HEADER)
        try:  # adopt only what this library sealed (engine/drive/seals.py)
            sealed = seals.adopt_sealed(core.store, self._durable.engine.emit, key, effect_id, raw, mac)
            result = core.claim(key, effect_id, after=after, adopt=adopt_of(raw) if sealed else None)
        except ClaimUnknown as exc:
            # the claim may have applied: the retry takes it over if so (and runs the handler once)
            value = [list(exc.owners), exc.attempt]
            mac = seals.seal_adopt(core.store, key, effect_id, value)  # None: no key, the claim's lease lapses
            adopt = {ADOPT_HEADER: value, ADOPT_SEAL_HEADER: mac} if mac is not None else {}
            headers = dict(getattr(task.request, "headers", None) or {}) | adopt
            raise task.retry(exc=exc, countdown=1.0, max_retries=None, headers=headers) from exc
        except StoreUnavailable as exc:  # the lane stays due: retrying here only makes it faster
            raise task.retry(exc=exc, countdown=1.0, max_retries=None) from exc
        claim = result.claim
        if claim is None:
            # early: due later; contended (rounds used up): the row is still this message's to run
            if (
                result.reason in (ClaimOutcome.EARLY, ClaimOutcome.CONTENDED)
                and result.wait <= core.settings.fast_send_max
            ):
                raise task.retry(countdown=result.wait, max_retries=None)
            if result.reason == ClaimOutcome.MISSING and retry_stale(
                task, self._durable.engine.counters, "no such row"
            ):
                return "missing (retrying)"
            log.info("effect %s (key %s) not run: %s", effect_id, key, result.reason)
            return result.reason
        definition = self.effects.get(claim.type)
        if definition is None:  # routed here by name, so this is a deployment mismatch
            error = f"no handler for effect type {claim.type!r} in this worker"
            core.settle(claim, RETRY, error=error, delay=core.settings.queue_timeout)
            log.error("effect %s: %s", effect_id, error)
            return "unknown-type"
        return self._run(task, core, claim, definition)

    def _run(self, task: Any, core: OutboxEngine, claim: Claim, definition: EffectDef) -> str:
        """Run a claimed row, then the key's next rows this settle claimed (up to ``drain_max``):
        a busy key costs no message and no claim round trips between its rows."""
        keeper = self._durable.engine.effect_keeper
        # drain_max rows in all: this one and drain_max - 1 successors
        budget, first = core.settings.drain_max - 1, True
        limit, started, longest = time_limit(task, self._durable.app, task.request), time.monotonic(), 0.0
        current: Claim | None = claim
        kind = "unknown"
        while current is not None:
            # the task's time limit covers every row it runs: claim the next row only while this
            # one and the next fit (at their timeout, or the longest run so far) with room to spare
            row_max = max(definition.timeout or 0.0, longest)
            room = limit is None or time.monotonic() - started + 2.5 * row_max + 1.0 < limit
            follow = (current.type,) if budget > 0 and room else ()
            began = time.monotonic()
            outcome = execute(core, current, definition, keeper, claim_next=follow)
            longest = max(longest, time.monotonic() - began)
            kind = outcome.kind
            log.info("effect %s (%s) attempt %d: %s", current.effect_id, current.type, current.attempt, kind)
            if kind == RETRY:
                # the row is pending again (lease ownership was checked by that settle); Celery's own
                # retry carries the countdown (for a successor: a message of its own), the scan
                # re-sends it if that message is lost
                if first:
                    cause = outcome.error if isinstance(outcome.error, Exception) else None
                    raise task.retry(countdown=outcome.delay, max_retries=None, exc=cause)
                core.send(current.ref, countdown=outcome.delay or None)
                return kind
            current, first, budget = current.successor, False, budget - 1
        return kind

    # --- client API -------------------------------------------------------------------------------

    def _effect(
        self,
        effect_type: str,
        payload: Any,
        key: str | None,
        effect_id: str | None,
        available_at: datetime | float | None,
        delay: timedelta | float | None,
    ) -> Doc:
        definition = self.effects.require(effect_type)
        data = definition.encode(payload)  # a bad payload raises here, in the caller
        core = self.core
        at: float | None = None
        if isinstance(available_at, datetime):
            at = available_at.timestamp()
        elif available_at is not None:
            at = float(available_at)
        if delay is not None:
            at = max(at or 0.0, core.clock.now() + _seconds(delay))
        return core.effect_body(
            effect_type,
            data,
            key=key,
            effect_id=effect_id,
            available_at=at,
            replay_safe=definition.replay_safe,
            max_attempts=definition.policy.maximum_attempts,
        )

    @_shielded
    def enqueue(
        self,
        effect_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        effect_id: str | None = None,
        available_at: datetime | float | None = None,
        delay: timedelta | float | None = None,
        with_docs: Sequence[Doc | Op] = (),
    ) -> Admitted:
        """Enqueue an effect, idempotent by ``effect_id`` (a repeat writes and wakes nothing).

        ``key`` is the ordering lane (default: the effect's own id, i.e. unordered). With
        ``with_docs`` (documents to create, or store ``Op``\\ s, all in one partition) the
        effect is recorded in the same all-or-nothing batch as them — the transactional outbox
        — and admitted to its lane right after the commit (by beat's scan if this process dies
        first).
        """
        effect = self._effect(effect_type, payload, key, effect_id, available_at, delay)
        core = self.core
        if not with_docs:
            return core.admit(effect)
        ops = [item if isinstance(item, Op) else Op.create(item) for item in with_docs]
        pks = {op.doc["pk"] for op in ops if op.doc is not None}
        if len(pks) != 1:
            raise ConfigurationError("with_docs must hold documents of exactly one partition")
        pk = pks.pop()
        core.check_admissible(effect)  # a full lane or a taken id fails here, before your documents commit
        intent = core.intent(pk, effect)
        core.store.batch(pk, [*ops, Op.create(intent)])
        try:
            admitted = core.admit_intent(intent)
        except (LaneFull, StoreError) as exc:
            # committed with your documents: an error now must not read as "not enqueued" (a
            # retry without an effect id would enqueue it twice). The intent is due: beat's scan
            # admits it (once the lane has room, if it filled up since the check)
            log.warning("effect %s committed; admitted later by the scan: %s", effect["id"], exc)
            return Admitted(str(effect["id"]), str(effect["key"]), True)
        if admitted is None:  # the id holds another request (raced past the check above)
            left = core.store.read(pk, intent["id"])
            waiting = left is not None and not left.get("conflict")
            raise IdempotencyConflict(
                f"effect id {effect['id']!r} is held by another request; your documents committed"
                + (" and the effect waits for that request to fail or finish" if waiting else ""),
                pending=waiting,
            )
        return admitted

    @_shielded
    def enqueue_many(self, effects: Sequence[EffectSpec | dict[str, Any]]) -> list[Admitted]:
        """Enqueue many effects in one call: one index write each, then one head read and one
        batch per key and chunk (a key's rows keep the order given). Each item is an
        :class:`EffectSpec` or a dict of :meth:`enqueue`'s arguments (``type``, ``payload``,
        ``key``, ``effect_id``, ``available_at``, ``delay``). Every payload is validated before
        anything is written; an :class:`IdempotencyConflict` or :class:`LaneFull` of one effect
        is raised after all the others were admitted."""
        specs = [e if isinstance(e, EffectSpec) else EffectSpec(**e) for e in effects]
        bodies = [self._effect(e.type, e.payload, e.key, e.effect_id, e.available_at, e.delay) for e in specs]
        ids = [str(b["id"]) for b in bodies]
        if len(set(ids)) != len(ids):
            raise ConfigurationError("enqueue_many: an effect id appears twice in one call")
        return self.core.admit_many(bodies)

    @_shielded
    def enqueue_ops(
        self,
        pk: str,
        effect_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        effect_id: str | None = None,
        available_at: datetime | float | None = None,
        delay: timedelta | float | None = None,
    ) -> list[Op]:
        """Store ops recording the effect in partition ``pk``: add them to your own ``store.batch(pk,
        ...)``, then call :meth:`flush` (optional: beat's scan admits it after the grace period)."""
        effect = self._effect(effect_type, payload, key, effect_id, available_at, delay)
        return [Op.create(self.core.intent(pk, effect))]

    @_shielded
    def flush(self, pk: str, ops: Sequence[Op | str]) -> int:
        """Admit intents committed with :meth:`enqueue_ops` (ops, or effect ids) now."""
        core, done = self.core, 0
        for item in ops:
            doc_id = item.doc_id if isinstance(item, Op) else intent_id(item)
            doc = core.store.read(pk, doc_id)
            if doc is not None and core.admit_intent(doc) is not None:
                done += 1
        return done

    @_shielded
    def get(self, effect_id: str) -> EffectInfo | None:
        row = self.core.get(effect_id)
        return None if row is None else EffectInfo.from_row(row)

    @_shielded
    def rows(self, key: str) -> list[EffectInfo]:
        """Every row of a key still stored (live, settled within retention, failed), in order."""
        return [EffectInfo.from_row(r) for r in self.core.rows(key)]

    def wait(self, effect_id: str, timeout: float = 60.0, poll: float = 0.02) -> EffectInfo:
        """Block until the effect is settled (succeeded, failed or cancelled).

        Unlike the other calls not shielded as a whole: each read is (``get``), and a handler
        waiting here is stopped between reads by its timeout or a cancel."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.get(effect_id)
            if info is not None and info.done:
                return info
            if time.monotonic() > deadline:
                state = "unknown" if info is None else info.status
                raise DurableTimeoutError(f"effect {effect_id!r} still {state} after {timeout}s")
            # in short sleeps: an interrupt lands between two of them, never inside one
            until = time.monotonic() + poll
            while (left := until - time.monotonic()) > 0:
                time.sleep(min(left, 0.05))

    @_shielded
    def cancel(
        self,
        effect_id: str | None = None,
        *,
        key: str | None = None,
        types: Sequence[str] | None = None,
        reason: str = "cancelled",
    ) -> int:
        """Cancel pending or running effects by id, or all of ``key`` (of ``types``); return how many.

        A running handler is told (``effect_context().cancelled()``) and stopped; the later effects
        of the key start once it has stopped (``cancel`` itself returns at once). Effects not yet
        admitted are cancelled too.
        """
        return self.core.cancel(effect_id, key=key, types=types, reason=reason)

    @_shielded
    def problems(self, limit: int = 100) -> Problems:
        """Effects that failed for good (oldest first) and lanes and intents the liveness scan has
        not acted on for two scan intervals, across every key: at most ``limit`` of each."""
        return self.core.problems(limit)

    @_shielded
    def retry(self, effect_id: str) -> str:
        """Run a failed effect again: a new row (same type, key and payload) at the end of its key;
        the failed row stays, for the record, and leaves :meth:`problems`. Returns the new id:
        ``<id>:retry1`` for ``<id>``, ``<id>:retry2`` for ``<id>:retry1``, and so on.

        At most once per failed row: the id is decided by the row retried, so callers racing
        enqueue one row (the outbox admits an effect id once), and a row already retried answers
        its retry's id, running nothing. :class:`OperationRefused` if unknown or not failed."""
        info = self.get(effect_id)
        if info is None or info.status != FAILED:
            raise OperationRefused(f"effect {effect_id!r} is {'unknown' if info is None else info.status}, not failed")
        if info.retried_as is not None:
            return info.retried_as
        base, _, n = effect_id.rpartition(":retry")
        new_id = f"{base}:retry{int(n) + 1}" if base and n.isdigit() else f"{effect_id}:retry1"
        self.enqueue(info.type, info.payload, key=info.key, effect_id=new_id)
        self.core.retried(effect_id, new_id)  # enqueued first: a crash between leaves it listed, not lost
        return new_id

    @_shielded
    def scan(self) -> ScanReport:
        """One liveness pass (what beat's outbox scan runs: glue/beat_scans.py ``outbox_pass``)."""
        return self.core.scan()
