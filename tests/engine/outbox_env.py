"""A synchronous outbox harness shared by the outbox tests: one store, an in-process sender, a
fake clock and a 'worker' that claims, runs and settles in the test's thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from celery_durable.codecs import ValueCodec
from celery_durable.engine import Registry
from celery_durable.engine.outbox import RETRY, EffectRef, InlineSender, OutboxEngine, OutboxSettings, lane_pk, row_id
from celery_durable.engine.outbox.runtime import EffectDef, EffectKeeper, Outcome, effects_of, execute
from celery_durable.stores import Store
from celery_durable.stores.memory import MemoryStore


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class Email(BaseModel):
    to: str
    n: int = 0


class Env:
    """An outbox on one store, an in-process sender and a synchronous 'worker'."""

    def __init__(self, store: Store, clock: Any = None, **settings: Any) -> None:
        self.store = store
        self.clock = clock or FakeClock()
        self.sender = InlineSender()
        self.settings = OutboxSettings(**({"lease_ttl": 10.0, "heartbeat_interval": 2.0} | settings))
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.outbox = OutboxEngine(
            store, self.sender, self.settings, self.clock, events=lambda e, **kw: self.events.append((e, kw))
        )
        self.registry = Registry()
        self.effects = effects_of(self.registry)
        self.keeper = EffectKeeper(poll=0.02)
        self.delayed: list[tuple[float, EffectRef]] = []
        self.ran: list[tuple[str, int]] = []

    def handler(self, effect_type: str, **options: Any) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        def wrap(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            hint = fn.__annotations__.get("payload", Any)
            codec = ValueCodec(Email if hint == "Email" else Any)
            self.effects.add(EffectDef(effect_type, fn, codec, **options))
            return fn

        return wrap

    def enqueue(self, effect_type: str, payload: Any = None, **kw: Any) -> Any:
        definition = self.effects.require(effect_type)
        body = self.outbox.effect_body(
            effect_type,
            definition.encode(payload),
            key=kw.get("key"),
            effect_id=kw.get("effect_id"),
            available_at=kw.get("available_at"),
            replay_safe=definition.replay_safe,
            max_attempts=definition.policy.maximum_attempts,
        )
        return self.outbox.admit(body)

    def deliver(self, ref: EffectRef) -> Outcome | str:
        result = self.outbox.claim(ref.key, ref.effect_id)
        if result.claim is None:
            if result.reason == "early":
                self.delayed.append((self.clock.now() + result.wait, ref))
            return result.reason
        self.ran.append((ref.effect_id, result.claim.attempt))
        outcome = execute(self.outbox, result.claim, self.effects.require(ref.type), self.keeper)
        if outcome.kind == RETRY:
            self.delayed.append((self.clock.now() + outcome.delay, ref))
        return outcome

    def drain(self, advance: bool = True, limit: int = 1000) -> None:
        """Deliver everything sent; with ``advance``, move the fake clock to each retry."""
        for _ in range(limit):
            sent = self.sender.take()
            if sent:
                for ref in sent:
                    self.deliver(ref)
                continue
            if not (advance and self.delayed):
                return
            self.delayed.sort(key=lambda item: item[0])
            due, ref = self.delayed.pop(0)
            if isinstance(self.clock, FakeClock) and due > self.clock.now():
                self.clock.t = due
            self.deliver(ref)
        raise AssertionError("drain did not settle")

    def row(self, key: str, effect_id: str) -> dict[str, Any]:
        doc = self.store.read(lane_pk(key), row_id(effect_id))
        assert doc is not None
        return doc


# --- the Celery glue, in process: a Durable on a memory store, an in-process sender, a fake task ---


class Retry(Exception):
    """What the fake task's ``retry`` returns (Celery's ``Retry``): the delivery is redelivered."""

    def __init__(self, countdown: float | None) -> None:
        super().__init__(countdown)
        self.countdown = countdown


class FakeTask:
    """A handler task as ``Outbox.deliver`` sees it: a request without headers, and ``retry``."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.request = SimpleNamespace(headers=None, id="fake-task", retries=0, timelimit=None)

    def retry(
        self, countdown: float | None = None, max_retries: int | None = None, exc: Any = None, **options: Any
    ) -> Retry:
        self.retried_with = options  # Celery's retry takes message options (headers=...) as well
        return Retry(countdown)


class Glue:
    """``durable.outbox`` on a MemoryStore with a fake clock; messages are kept, not sent."""

    def __init__(self, **conf: Any) -> None:
        from celery import Celery

        from celery_durable import Durable

        self.app = Celery(f"outbox-glue-{id(self)}", set_as_current=False)
        self.app.conf.update(
            {"durable_lease_ttl": 10.0, "durable_heartbeat_interval": 2.0, "durable_outbox_cancel_poll": 0.05}
            | {f"durable_{k}": v for k, v in conf.items()}
        )
        self.store = MemoryStore()
        self.durable = Durable(self.app, store=self.store)
        self.outbox = self.durable.outbox
        self.core = self.durable.engine.outbox
        self.sender = InlineSender()
        self.core.sender = self.sender
        self.clock = FakeClock()
        self.core.clock = self.clock
        self.task = FakeTask()

    def deliver_all(self, limit: int = 100) -> list[str]:
        """Deliver every message sent so far (a Celery retry is redelivered at once)."""
        results: list[str] = []
        for _ in range(limit):
            sent = self.sender.take()
            if not sent:
                return results
            for ref in sent:
                try:
                    results.append(self.outbox.deliver(self.task, ref.key, ref.effect_id))
                except Retry:
                    self.sender.send_effect(ref)
        return results

    def pass_time(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.outbox.scan()
        self.deliver_all()

    def close(self) -> None:
        self.durable.shutdown()
