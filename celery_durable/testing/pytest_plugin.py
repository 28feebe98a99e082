"""pytest fixtures to test your workflows; loaded by pytest on its own (the ``celery_durable``
plugin, a ``pytest11`` entry point). No Docker, no broker or database server.

Point them at your :class:`~celery_durable.Durable`, like pytest-django's settings module, in
your pytest configuration::

    [tool.pytest.ini_options]
    durable_app = "myproject.tasks:durable"      # a Durable, or a Celery app that has one

or by overriding the ``durable_app`` fixture in your ``conftest.py``.

* ``durable_env`` — a :class:`~celery_durable.testing.env.WorkflowEnvironment` on your
  workflows: in-process, in-memory, on a fake clock that skips timers.
* ``durable_worker`` — a real Celery worker (a thread of the test process) consuming your app's
  queues, with your app switched for the test to a ``filesystem://`` broker and a SQLite store
  in a temporary folder: ``workflow.start(...)`` then ``h.result(timeout=...)`` as in production.
  Timers longer than ``durable_timer_fast_path_max`` need beat's clock scan, which is not run.
  Override ``durable_worker_parameters`` to change the pool (``threads``) or its concurrency.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable.app import Durable
from celery_durable.testing.env import WorkflowEnvironment

__all__ = ["DurableWorker", "load_durable"]

INI_NAME = "durable_app"

#: broker settings the worker fixture replaces for the test (restored afterwards)
_BROKER_KEYS = ("broker_url", "broker_read_url", "broker_write_url", "broker_transport", "broker_transport_options")
#: Celery reads these before its configuration
_BROKER_ENV = ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL")


@dataclass(frozen=True)
class DurableWorker:
    """What ``durable_worker`` yields: the extension, the running worker, where things are kept."""

    durable: Durable
    app: Celery
    worker: Any  # celery.worker.WorkController
    store_url: str
    broker_folder: Path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI_NAME, f"the Durable the {INI_NAME} fixture returns: 'package.module:attribute'")


def load_durable(spec: str) -> Durable:
    """The :class:`Durable` named by ``'module:attribute'`` (a Durable or a Celery app with one)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{INI_NAME} = {spec!r}: expected 'package.module:attribute'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if isinstance(target, Durable):
        return target
    if isinstance(target, Celery):
        return Durable.of(target)
    raise TypeError(f"{INI_NAME} = {spec!r} is a {type(target).__name__}, not a Durable or a Celery app")


@pytest.fixture
def durable_app(request: pytest.FixtureRequest) -> Durable:
    """Your :class:`Durable`: from the ``durable_app`` ini option, or override this fixture."""
    spec = str(request.config.getini(INI_NAME) or "")
    if not spec:
        pytest.fail(
            f'the celery_durable fixtures need your Durable: set `{INI_NAME} = "package.module:durable"` '
            f"in your pytest configuration, or define a `{INI_NAME}` fixture in conftest.py that returns it",
            pytrace=False,
        )
    return load_durable(spec)


@pytest.fixture
def durable_env(durable_app: Durable) -> Iterator[WorkflowEnvironment]:
    """A fresh in-memory, time-skipping :class:`WorkflowEnvironment` on your workflows."""
    env = WorkflowEnvironment(durable_app)
    try:
        yield env
    finally:
        env.engine.shutdown(release=False)


@pytest.fixture
def durable_worker_parameters() -> dict[str, Any]:
    """Keyword arguments of ``celery.contrib.testing.worker.start_worker`` (override to change)."""
    return {"pool": "threads", "concurrency": 4}


@pytest.fixture
def durable_worker(
    durable_app: Durable,
    durable_worker_parameters: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[DurableWorker]:
    """A real Celery worker on your app, over a filesystem broker and a SQLite store of its own."""
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state as worker_state

    from celery_durable.glue.filesystem_transport import stop_waiting

    folder = tmp_path_factory.mktemp("durable_worker")
    store_url = f"sqlite:///{folder / 'durable.db'}"
    app = durable_app.app
    for name in _BROKER_ENV:
        monkeypatch.delenv(name, raising=False)
    changes = app.conf.changes
    saved = {key: changes[key] for key in _BROKER_KEYS if key in changes}
    saved_store = durable_app._store_arg  # a URL, a Store, or None (the settings' URL)
    app.conf.update(
        broker_url="filesystem://",
        broker_read_url=None,
        broker_write_url=None,
        # kombu's filesystem transport with atomic writes (celery_durable/glue/filesystem_transport.py)
        broker_transport="celery_durable.contrib.filesystem:Transport",
        broker_transport_options=_broker_folders(folder / "broker"),
    )
    _reset_connections(app)
    durable_app.configure(store=store_url)
    options = {"perform_ping_check": False, "loglevel": "WARNING", **durable_worker_parameters}
    try:
        with start_worker(app, **options) as worker:
            timer = getattr(worker, "timer", None)
            if timer is not None:
                # Celery's timer thread waits up to 1 s on an empty schedule, and its stop()
                # does not wake it: a no-op entry keeps each wait short, so teardown is quick
                timer.call_repeatedly(0.05, _tick)
            try:
                yield DurableWorker(durable_app, app, worker, store_url, folder / "broker")
            finally:
                # what start_worker's exit does before it joins the worker thread, done first, and
                # the consumer woken: the thread ends now, not after its 2 s wait for a message
                worker_state.should_terminate = 0
                stop_waiting()
    finally:
        stop_waiting(False)
        engine = durable_app.engine_if_built
        durable_app.configure(store=saved_store)
        if engine is not None and engine.store is not saved_store:
            engine.store.close()  # the test's SQLite file
        for key in _BROKER_KEYS:
            changes.pop(key, None)
        changes.update(saved)
        _reset_connections(app)


def _tick() -> None:
    """The worker timer's keep-awake entry (see ``durable_worker``)."""


def _broker_folders(root: Path) -> dict[str, Any]:
    """Transport options of the ``filesystem://`` broker: one queue folder (producer and consumer
    on one host), and the exchange tables in ``control`` (so two tests never share messages)."""
    folders = {name: root / name for name in ("queue", "processed", "control")}
    for path in folders.values():
        path.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": 0.05,
    }


def _reset_connections(app: Celery) -> None:
    """Drop the app's pooled broker connections: the next message uses the broker now configured
    (what Celery itself does after a fork)."""
    pool = app._pool
    if pool is not None:
        pool.force_close_all()
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
