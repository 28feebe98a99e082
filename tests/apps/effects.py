"""A Celery app for the outbox tests: ``celery -A tests.apps.effects worker``.

Configured from the environment (like ``tests.apps.basic``) so each test points it at its own
broker queue and store. Handlers append one JSON line per run to ``$TEST_MARKS_DIR/fx.log``
(small ``O_APPEND`` writes: safe across processes) so a test can see what ran, where and when.

The ``flaky+<url>`` store scheme wraps a real store and fails the settle of effect ``X`` once
(``StoreUnavailable``) when the file ``$TEST_MARKS_DIR/fail-settle-X`` exists.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.outbox import effect_context
from celery_durable.stores import Store, register_backend, store_from_url
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead
from tests.apps._common import env_app, env_float

app = env_app(
    "effects",
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_outbox_scan_interval=env_float("TEST_OUTBOX_SCAN", "5"),
    durable_outbox_queue_timeout=env_float("TEST_OUTBOX_QUEUE_TIMEOUT", "60"),
    durable_outbox_cancel_poll=env_float("TEST_OUTBOX_CANCEL_POLL", "1"),
    durable_outbox_retention=env_float("TEST_OUTBOX_RETENTION", str(7 * 24 * 3600)),
)
durable = Durable(app)


def marks() -> Path:
    path = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_run(event: str, **extra: Any) -> None:
    ctx = effect_context()
    line = {"event": event, "id": ctx.effect_id, "key": ctx.key, "attempt": ctx.attempt, "pid": os.getpid()}
    line.update(t=time.time(), **extra)
    with (marks() / "fx.log").open("a") as fh:
        fh.write(json.dumps(line) + "\n")


class Rec(BaseModel):
    sleep: float = 0.0


class Flaky(BaseModel):
    failures: int


class Gate(BaseModel):
    path: str


class Declined(Exception):
    pass


@durable.effect("fx.record")
def record(payload: Rec) -> None:
    log_run("start")
    if payload.sleep:
        time.sleep(payload.sleep)
    log_run("end")


@durable.effect("fx.record_bound", replay_safe=False)
def record_bound(payload: Rec) -> None:
    log_run("start")
    log_run("end")


@durable.effect("fx.flaky")
def flaky(payload: Flaky) -> None:
    log_run("start")
    if effect_context().attempt <= payload.failures:
        raise ConnectionError(f"attempt {effect_context().attempt} failed")
    log_run("end")


@durable.effect("fx.always", max_attempts=3)
def always(payload: Rec) -> None:
    log_run("start")
    raise ConnectionError("service down")


@durable.effect("fx.declined", non_retryable=(Declined,))
def declined(payload: Rec) -> None:
    log_run("start")
    raise Declined("card declined")


def _wait_gate(path: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        effect_context().sleep(0.02)


@durable.effect("fx.gate")
def gate(payload: Gate) -> None:
    log_run("start")
    _wait_gate(payload.path)
    log_run("end")


@durable.effect("fx.gate_bound", replay_safe=False)
def gate_bound(payload: Gate) -> None:
    log_run("start")
    _wait_gate(payload.path)
    log_run("end")


@durable.effect("fx.busy")
def busy(payload: Rec) -> None:
    """CPU-bound and never checks for cancellation: stopping it needs the interrupt."""
    log_run("start")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sum(range(1000))
    finally:
        log_run("stopped")


@durable.effect("fx.self_cancel", interruptible=False)
def self_cancel(payload: Rec) -> None:
    """Runs to the end, then is cancelled before its settle (a cancel racing the settle)."""
    log_run("start")
    durable.outbox.cancel(effect_context().effect_id, reason="cancelled after execution")
    log_run("end")


@durable.workflow(name="fx.notify")
def notify(name: str) -> list[str]:
    """Emits between durable timers, so the emits are replayed several times."""
    first = wf.emit("fx.record", Rec(), key=f"notify-{name}")
    wf.sleep(0.2)
    second = wf.emit("fx.record", {"sleep": 0.0}, key=f"notify-{name}")
    wf.sleep(0.2)
    return [first, second]


@durable.workflow(name="fx.reemit", signals={"go": str})
def reemit(name: str) -> str:
    """Emits, then waits: cancelled there and reset to step 1, the re-run emits again."""
    eid = wf.emit("fx.record", Rec(), key=f"reemit-{name}")
    wf.wait_signal("go")
    return eid


class FlakyStore(Store):
    """Delegates to a real store; fails chosen settles once (see the module docstring)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        for op in ops:
            doc = op.doc or {}
            if doc.get("type") == "effect" and doc.get("status") == "succeeded":
                trap = marks() / f"fail-settle-{doc['effect_id']}"
                if trap.exists():
                    trap.unlink()
                    raise StoreUnavailable("injected: the store went away during the settle")
        return self.inner.batch(pk, ops)

    def read(self, pk: str, doc_id: str) -> Doc | None:
        return self.inner.read(pk, doc_id)

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        return self.inner.read_many(pk, ids)

    def create(self, doc: Doc) -> str | None:
        return self.inner.create(doc)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return self.inner.replace(doc, if_match)

    def upsert(self, doc: Doc) -> str:
        return self.inner.upsert(doc)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        return self.inner.delete(pk, doc_id, if_match)

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        return self.inner.query_partition(pk, since)

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        return self.inner.scan_due(kind, now, limit)

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        self.inner.close()


def flaky_store(url: str, **options: Any) -> FlakyStore:
    return FlakyStore(store_from_url(url.split("+", 1)[1], **options))


for _scheme in ("flaky+sqlite", "flaky+cosmos", "flaky+cosmoss"):
    register_backend(_scheme, "tests.apps.effects:flaky_store")
