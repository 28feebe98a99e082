from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.postgres import _postgres_server, postgres_schema, postgres_url  # noqa: F401 - fixtures
from tests.plugins.workers import WorkerFactory, broker_url

#: replica lag of the ``cosmos-lag`` store variant (ms)
COSMOS_LAG_MS = 300


@dataclass
class Cluster:
    """The test process as a client of the test app, plus the workers it starts."""

    broker: str
    store_url: str
    workers: WorkerFactory
    queue: str

    @property
    def durable(self):  # type: ignore[no-untyped-def]
        return basic.durable

    @contextmanager
    def client_of(self, module: Any, marks: Path) -> Iterator[Any]:
        """The test process as a client of another test app ``module`` (its ``app``, ``durable``
        and ``MARKS``) on this cluster's broker, queue and store; its workers mark in ``marks``."""
        app = module.app
        app.conf.update(broker_url=self.broker, task_default_queue=self.queue)
        app._pool = None
        app.amqp._producer_pool = None
        module.durable.configure(store=self.store_url)
        self.workers.env.update(TEST_MARKS_DIR=str(marks))
        module.MARKS = marks
        routes = app.conf.task_routes
        try:
            yield module.durable
        finally:
            app.conf.task_routes = routes
            module.durable.configure(store=None)

    def start_worker(self, **kw):  # type: ignore[no-untyped-def]
        return self.workers.start(**kw)


def _store_url(kind: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'durable.db'}"
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_url"))  # a fresh schema
    if kind == "cosmos":
        return str(request.getfixturevalue("cosmos_url"))
    if kind == "cosmos-lag":
        # the Cosmos test server's replica-lag mode (issue 16): reads without a fresh enough
        # session token see the previous version of a document for COSMOS_LAG_MS after a write
        server = request.getfixturevalue("cosmos_server")
        server.set_replica_lag(COSMOS_LAG_MS)
        request.addfinalizer(lambda: server.running and server.set_replica_lag(0))
        return str(request.getfixturevalue("cosmos_url"))
    raise ValueError(kind)


def make_cluster(request: pytest.FixtureRequest, tmp: Path, workers: WorkerFactory, broker: str, store: str) -> Cluster:
    url, opts = broker_url(broker, tmp)
    store_url = _store_url(store, tmp, request)
    queue = f"q-{uuid.uuid4().hex[:10]}"
    import json

    workers.env.update(
        TEST_BROKER_URL=url,
        TEST_BROKER_OPTIONS=json.dumps(opts),
        DURABLE_STORE_URL=store_url,
        TEST_QUEUE=queue,
    )
    app = basic.app
    transport = "celery_durable.contrib.filesystem:Transport" if broker == "filesystem" else None
    app.conf.update(broker_url=url, broker_transport_options=opts, task_default_queue=queue, broker_transport=transport)
    # drop connections made for an earlier test's broker
    app._pool = None
    app.amqp._producer_pool = None
    basic.durable.configure(store=store_url)
    return Cluster(url, store_url, workers, queue)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path, worker_factory: WorkerFactory) -> Iterator[Cluster]:
    broker, store = getattr(request, "param", ("redis", "sqlite"))
    yield make_cluster(request, tmp_path, worker_factory, broker, store)
