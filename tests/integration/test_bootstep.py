"""The worker bootstep: a stopping worker gives back its leases and stops its heartbeat.

Runs Celery's own in-process worker (``celery.contrib.testing.worker.start_worker``, solo pool,
in-memory broker): the same blueprint ``celery worker`` builds.
"""

from __future__ import annotations

import threading
import time

from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_durable import Durable
from celery_durable.bootsteps import DurableStep

STARTED = threading.Event()
RELEASE = threading.Event()


def _app() -> tuple[Celery, Durable]:
    app = Celery("bootstep-test", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    durable = Durable(app, store="memory://", heartbeat_interval=0.05, lease_ttl=30)
    return app, durable


def test_the_step_is_in_the_worker_blueprint_and_stopping_releases_leases() -> None:
    app, durable = _app()
    assert DurableStep in app.steps["worker"]

    @app.task(name="bootstep.slow")
    def slow() -> int:
        STARTED.set()
        RELEASE.wait(10)
        return 1

    from celery_durable import durable_activity

    step = durable_activity(slow)

    @durable.workflow(name="bootstep.flow")
    def flow() -> int:
        return step()

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
