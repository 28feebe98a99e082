"""Adversarial tests of the effect outbox on real ``celery worker`` processes (findings: each fails
on the code it was written against). See tests/engine/test_adversarial_outbox.py for the rest."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_outbox import ENV, Fx
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


@pytest.fixture
def fx(cluster: Any) -> Iterator[Fx]:
    from tests.apps import effects

    app = effects.app
    app.conf.update(
        broker_url=cluster.broker,
        task_default_queue=cluster.queue,
        durable_lease_ttl=2.0,
        durable_heartbeat_interval=0.5,
        durable_outbox_queue_timeout=3.0,
        durable_outbox_cancel_poll=0.1,
        durable_outbox_retention=7 * 24 * 3600.0,
    )
    app._pool = None
    app.amqp._producer_pool = None
    effects.durable.configure(store=cluster.store_url)
    yield Fx(cluster)
    effects.durable.configure(store=None)


@pytest.mark.parametrize("pool", ["threads", "prefork", "solo"])
def test_warm_shutdown_stops_the_heartbeat_of_a_handler_still_running(fx: Fx, pool: str) -> None:
    """Promise (Leases): "A claim takes a lease (owner + expiry) renewed by a heartbeat thread";
    (Cancel) "a key never runs two handlers at once". Break: on a warm shutdown (SIGTERM) the
    worker waits for its running tasks, but ``DurableStep.stop`` -> ``Durable.shutdown()`` stops
    the process's one heartbeat thread first. Under the threads pool the handlers run in that
    very process: their leases are no longer renewed (nor cancels noticed) while they
    finish. After ``lease_ttl`` beat's scan requeues the replay-safe row and another worker runs
    it while the first one still does (a process-bound row would be failed while it runs)."""
    gate = fx.marks.parent / f"gate-{pool}"
    first = fx.cluster.workers.start(app="tests.apps.effects", pool=pool, concurrency=2, env=ENV)
    fx.outbox.enqueue("fx.gate", {"path": str(gate)}, key="k", effect_id="g1")
    wait_until(lambda: fx.runs("g1"), what="the handler to start")
    first.proc.send_signal(signal.SIGTERM)  # warm shutdown: the running handler may finish
    # watch the lease for three TTLs while the handler keeps running (the gate is closed)
    expired_at: float | None = None
    deadline = time.monotonic() + 3 * 2.0
    while time.monotonic() < deadline and expired_at is None:
        info = fx.outbox.get("g1")
        lease = info.lease if info is not None else None
        if info is not None and info.status == "running" and lease and float(lease["expires"]) < time.time() - 0.5:
            expired_at = time.time()
        time.sleep(0.05)
    if expired_at is not None:  # show what follows: beat requeues it, a second worker runs it
        fx.outbox.scan()
        fx.cluster.workers.start(app="tests.apps.effects", pool="prefork", concurrency=2, env=ENV)
        wait_until(lambda: len(fx.runs("g1")) >= 2, timeout=20, what="a second run")
    gate.write_text("open")
    wait_until(lambda: first.proc.poll() is not None, timeout=20, what="the first worker to exit")
    assert expired_at is None and len(fx.runs("g1")) == 1, (
        f"{pool}: the lease of a handler still running lapsed after SIGTERM; runs: {fx.runs('g1')}"
    )


def test_draining_a_busy_key_kills_a_handler_well_inside_its_timeout(cluster: Any) -> None:
    """Promise (Retries): "timeout= stops a handler that runs too long"; (Order) "A delivery that
    finishes a row runs the key's next row ... itself ... up to durable_outbox_drain_max rows".
    Break: ``timeout=1`` sets the Celery task's hard ``time_limit`` to 1 + 10 = 11 s as a
    backstop for one handler, but the drain runs up to 50 rows of the key inside that one task.
    Sixteen 0.8 s handlers (each well inside its 1 s timeout) of one key: after ~11 s the prefork
    pool kills the child in the middle of a handler; that process-bound effect is then failed
    by the scan ("worker lost its lease after execution started")."""
    from tests.apps import adversarial_effects as adv

    app = adv.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    adv.durable.configure(store=cluster.store_url)
    try:
        env = ENV | {"TEST_OUTBOX_SCAN": "0.5"}
        cluster.workers.start(app="tests.apps.adversarial_effects", pool="prefork", concurrency=1, env=env)
        cluster.workers.start_beat(app="tests.apps.adversarial_effects", env=env)
        ids = [f"s{i:02d}" for i in range(16)]
        adv.durable.outbox.enqueue_many(
            [{"type": "adv.step", "payload": {}, "key": "busy", "effect_id": i} for i in ids]
        )
        infos = {i: adv.durable.outbox.wait(i, timeout=90) for i in ids}
        bad = {i: (x.status, x.reason) for i, x in infos.items() if x.status != "succeeded"}
        assert not bad, f"handlers within their timeout were killed by the drained task's time limit: {bad}"
    finally:
        adv.durable.configure(store=None)
