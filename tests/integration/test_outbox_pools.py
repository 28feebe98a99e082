"""Stopping effect handlers under every worker pool (issue 11), on real ``celery worker`` processes.

prefork, threads and solo run each task on its own OS thread: a cancel and a ``timeout`` interrupt
a handler stuck in a pure-Python loop. gevent and eventlet run every task on one OS thread, where
that interrupt cannot land: the worker refuses to start while it would run an interruptible or
timed effect (celery_durable/glue/pools.py), and a non-interruptible effect that checks
``effect_context().sleep()`` is still cancelled there (the heartbeat greenlet runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.apps import pools
from tests.plugins.workers import REPO, Worker, wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.pools"
ENV = {"TEST_LEASE_TTL": "2", "TEST_HEARTBEAT": "0.5", "TEST_OUTBOX_CANCEL_POLL": "0.1"}


@dataclass
class Px:
    cluster: Any

    @property
    def outbox(self) -> Any:
        return pools.durable.outbox

    @property
    def tmp(self) -> Path:
        return Path(self.cluster.workers.tmp)

    def worker(self, pool: str, env: dict[str, str] | None = None, extra: list[str] | None = None) -> Worker:
        return self.cluster.workers.start(app=APP, pool=pool, concurrency=2, env=ENV | (env or {}), extra=extra)  # type: ignore[no-any-return]

    def refused(self, pool: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Start a worker that must refuse: its exit code and output (fails if it gets ready)."""
        ready = self.tmp / f"refused-{uuid.uuid4().hex[:6]}.ready"
        full_env = dict(os.environ) | self.cluster.workers.env | ENV | (env or {}) | {"TEST_READY_FILE": str(ready)}
        cmd = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", pool, "-c", "2"]
        cmd += ["--loglevel=INFO", "--without-gossip", "--without-mingle"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: proc.poll() is not None or ready.exists(), timeout=30, what=f"the {pool} worker")
        finally:
            if proc.poll() is None:
                proc.kill()
            output = proc.communicate(timeout=10)[0].decode(errors="replace")
        assert not ready.exists(), f"the {pool} worker started instead of refusing:\n{output[-3000:]}"
        return proc.returncode, output

    def events(self, effect_id: str) -> list[tuple[str, str | None]]:
        path = self.tmp / "marks" / "pools.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(e["event"], e["exc"]) for e in map(json.loads, lines) if e["id"] == effect_id]

    def started(self, effect_id: str) -> bool:
        return ("start", None) in self.events(effect_id)


@pytest.fixture
def px(cluster: Any) -> Iterator[Px]:
    app = pools.app
    app.conf.update(
        broker_url=cluster.broker,
        task_default_queue=cluster.queue,
        durable_lease_ttl=2.0,
        durable_heartbeat_interval=0.5,
        durable_outbox_cancel_poll=0.1,
    )
    app._pool = None
    app.amqp._producer_pool = None
    pools.durable.configure(store=cluster.store_url)
    yield Px(cluster)
    pools.durable.configure(store=None)


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_cancel_and_timeout_interrupt_a_busy_handler(px: Px, pool: str) -> None:
    px.worker(pool)
    px.outbox.enqueue("pl.spin", {}, key="spin", effect_id="spin")
    wait_until(lambda: px.started("spin"), what="the spinning handler to start")
    assert px.outbox.cancel("spin", reason="operator") == 1
    info = px.outbox.wait("spin", timeout=15)
    assert info.status == "cancelled" and info.reason == "operator"
    # the loop itself was interrupted (not left running after the row was settled)
    wait_until(lambda: ("stopped", "EffectCancelled") in px.events("spin"), timeout=10, what="the interrupt")
    assert ("end", None) not in px.events("spin")

    px.outbox.enqueue("pl.spin_timeout", {}, key="slow", effect_id="slow")
    info = px.outbox.wait("slow", timeout=20)
    assert info.status == "failed" and "timed out after 1.0s" in (info.last_error or ""), info
    assert px.events("slow") == [("start", None), ("stopped", "EffectTimeout")]


@pytest.mark.parametrize(
    ("pool", "env", "green"),
    [
        pytest.param("gevent", {}, "gevent", id="gevent"),
        pytest.param("eventlet", {}, "eventlet", id="eventlet"),
        pytest.param("solo", {"TEST_MONKEY": "gevent"}, "gevent", id="solo-monkey-patched"),
    ],
)
def test_green_worker_refuses_interruptible_effects(px: Px, pool: str, env: dict[str, str], green: str) -> None:
    code, output = px.refused(pool, env)
    assert code != 0, output[-3000:]
    assert "ConfigurationError" in output, output[-3000:]
    message = output[output.index("ConfigurationError") :]
    for needle in (
        "'pl.spin' (interruptible=True)",
        "'pl.spin_timeout' (interruptible=True, timeout=1s)",
        f"on the {green} pool" if pool == green else f"a {pool} worker with threading monkey-patched by {green}",
        "interruptible=False and no timeout",
        "prefork, threads or solo worker",
    ):
        assert needle in message, f"{needle!r} not in:\n{message}"
    assert "pl.coop" not in message  # a cooperative effect is fine there


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_green_worker_cancels_a_cooperative_handler(px: Px, pool: str) -> None:
    # the interruptible effects go to a queue this worker does not consume, so it may start
    worker = px.worker(pool, env={"TEST_OS_QUEUE": f"{px.cluster.queue}-os"}, extra=["-Q", px.cluster.queue])
    px.outbox.enqueue("pl.coop", {}, key="coop", effect_id="coop")
    wait_until(lambda: px.started("coop"), what="the cooperative handler to start")
    assert px.outbox.cancel("coop", reason="operator") == 1
    info = px.outbox.wait("coop", timeout=15)
    assert info.status == "cancelled" and info.reason == "operator"
    # only the heartbeat notices a cancel while the handler runs: so it ran, as a greenlet
    wait_until(lambda: ("stopped", "EffectCancelled") in px.events("coop"), timeout=10, what="sleep() to raise")
    assert "effect coop stopped: cancelled" in worker.log()
