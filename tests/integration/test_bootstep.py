"""The worker bootstep: a stopping worker gives back its leases and stops its heartbeat.

Runs Celery's own in-process worker (``celery.contrib.testing.worker.start_worker``, solo pool,
in-memory broker): the same blueprint ``celery worker`` builds.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker, start_worker
from celery.worker import state

from celery_durable import Durable, durable_activity
from celery_durable.glue.bootsteps import DurableStep
from celery_durable.glue.outbox import effect_context

STARTED = threading.Event()
RELEASE = threading.Event()


def _app(**settings: Any) -> tuple[Celery, Durable]:
    app = Celery("bootstep-test", broker="memory://", backend="cache+memory://", set_as_current=False)
    # a queue of its own: the memory broker is one per process, and other test modules' apps
    # leave messages in its default queue
    app.conf.update(task_serializer="json", accept_content=["json"], task_default_queue=f"bootstep-{uuid.uuid4().hex}")
    durable = Durable(app, store="memory://", **({"heartbeat_interval": 0.05, "lease_ttl": 30} | settings))
    return app, durable


def test_the_step_is_in_the_worker_blueprint_and_stopping_releases_leases() -> None:
    app, durable = _app()
    assert DurableStep in app.steps["worker"]

    @app.task(name="bootstep.slow")  # type: ignore[untyped-decorator]
    def slow() -> int:
        STARTED.set()
        RELEASE.wait(10)
        return 1

    step = durable_activity(slow)

    @durable.workflow(name="bootstep.flow")
    def flow() -> int:
        return int(step())

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as worker:
        assert any(isinstance(s, DurableStep) for s in worker.blueprint.steps.values())
        h = flow.start()
        engine = durable.engine
        assert STARTED.wait(10), "the activity never started"
        deadline = time.monotonic() + 5
        while not engine.heartbeat.running:  # the attempt's lease is beaten by the one heartbeat
            assert time.monotonic() < deadline
            time.sleep(0.01)
        marker = engine.store.read(h.id, "s:000001")
        assert marker is not None and marker["lease"] is not None
        RELEASE.set()
    # the worker stopped: its step stopped this process's heartbeat
    assert not engine.heartbeat.running


def test_two_apps_in_one_process_each_drive_their_own_executions() -> None:
    """The library's tasks are registered per app: a second app's drives must not run with the
    first app's extension (Celery's ``app.task`` is shared by default across apps)."""
    first, first_durable = _app()
    second, second_durable = _app()

    @first_durable.workflow(name="bootstep.first")
    def one() -> str:
        return "first"

    @second_durable.workflow(name="bootstep.second")
    def two() -> str:
        return "second"

    assert first.tasks["celery_durable.drive"] is not second.tasks["celery_durable.drive"]
    with start_worker(second, pool="solo", perform_ping_check=False):
        assert two.start().result(timeout=10) == "second"


@pytest.mark.parametrize("stops", ["before-pool", "after-pool"])
def test_a_warm_shutdown_renews_leases_until_the_pool_has_drained(stops: str) -> None:
    """Issue 11: a warm shutdown (SIGTERM) waits in the Pool step's stop for the running tasks;
    the heartbeat must keep renewing their leases until then. The worker blueprint's order of
    steps without a dependency between them follows the set's hash order (``PYTHONHASHSEED``),
    so both places of ``DurableStep`` are forced here: with the step stopped before the Pool (a
    ``-P threads`` worker whose handlers run in this very process) the old step stopped the
    heartbeat while the activity and the effect still ran, and their leases lapsed."""
    app, durable = _app(heartbeat_interval=0.05, lease_ttl=30, outbox_cancel_poll=0.05)
    app.conf.task_default_queue = f"bootstep-{stops}"  # the memory broker is one per process
    release = threading.Event()
    started = {"activity": threading.Event(), "effect": threading.Event()}

    @app.task(name=f"bootstep.held.{stops}")  # type: ignore[untyped-decorator]
    def held() -> int:
        started["activity"].set()
        release.wait(20)
        return 1

    @durable.effect(f"bootstep.held_effect.{stops}")
    def held_effect(payload: dict[str, Any]) -> None:
        started["effect"].set()
        while not release.is_set():
            effect_context().sleep(0.02)

    step = durable_activity(held)

    @durable.workflow(name=f"bootstep.held_flow.{stops}")
    def flow() -> int:
        return int(step())

    setup_app_for_worker(app, "WARNING", None)
    worker = TestWorkController(
        app=app, concurrency=2, pool="threads", hostname=f"bootstep-{stops}@localhost", loglevel="WARNING",
        ready_callback=None, without_heartbeat=True, without_mingle=True, without_gossip=True,
    )  # fmt: skip
    ours = next(s for s in worker.steps if isinstance(s, DurableStep))
    pool = next(s for s in worker.steps if s.name == "celery.worker.components.Pool")
    worker.steps.remove(ours)  # steps stop in reverse order: right after the Pool, or first
    worker.steps.insert(worker.steps.index(pool) + 1 if stops == "before-pool" else 0, ours)
    pool_stopping = threading.Event()
    pool_stop = pool.stop

    def stop_pool(w: Any) -> None:
        pool_stopping.set()
        pool_stop(w)

    pool.stop = stop_pool  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.start, daemon=True)
    thread.start()
    try:
        worker.ensure_started()
        h = flow.start()
        durable.outbox.enqueue(f"bootstep.held_effect.{stops}", {}, key="k", effect_id="e1")
        assert started["activity"].wait(10) and started["effect"].wait(10), "the tasks never started"
        engine = durable.engine

        def expiries() -> tuple[float, float]:
            marker = engine.store.read(h.id, "s:000001")
            info = durable.outbox.get("e1")
            assert marker is not None and marker["lease"] is not None, "the running activity's lease was given back"
            assert info is not None and info.lease is not None, info
            return float(marker["lease"]["expires"]), float(info.lease["expires"])

        state.should_stop = 0  # what SIGTERM does: the consumer loop raises WorkerShutdown
        assert pool_stopping.wait(10), "the worker never began to stop its pool"
        before = expiries()  # the steps stopped before the Pool have stopped: still renewed?
        deadline = time.monotonic() + 5
        while not all(now > then for now, then in zip(expiries(), before, strict=True)):
            assert time.monotonic() < deadline, f"leases not renewed while the pool drains: {before}"
            time.sleep(0.02)
        release.set()
        thread.join(20)
        assert not thread.is_alive(), "the worker did not stop"
    finally:
        release.set()
        state.should_stop = None
        state.should_terminate = 0
        thread.join(10)
        state.should_terminate = None
    # once the pool drained, the step stopped the heartbeat; the finished tasks hold no lease
    assert not engine.heartbeat.running
    assert (engine.store.read(h.id, "s:000001") or {}).get("lease") is None
    info = durable.outbox.get("e1")
    assert info is not None and info.status == "succeeded", info
