from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.ui import flows

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    flows.FLAKY.clear()
    flows.MAILS.clear()
    return WorkflowEnvironment(flows.durable, store=SqliteStore(str(tmp_path / "ui.db")))


@pytest.fixture
def client(env: WorkflowEnvironment) -> Iterator[TestClient]:
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False) as c:
        yield c


def login(client: TestClient, token: str = TOKEN) -> str:
    """Log the client in; return the CSRF token its pages carry."""
    r = client.post("/login", data={"token": token, "next": "/executions"})
    assert r.status_code == 303, r.text
    page = client.get("/executions").text
    marker = 'name="csrf" value="'
    assert marker in page
    return page.split(marker, 1)[1].split('"', 1)[0]


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path, worker_factory: Any) -> Any:
    """A worker cluster of ``tests.apps.basic`` on Redis and SQLite (as tests/integration)."""
    from tests.integration.conftest import make_cluster

    return make_cluster(request, tmp_path, worker_factory, "redis", "sqlite")
