from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.plugins.workers import REPO, wait_until
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


def page_as_operator(engine: Any, path: str) -> Any:
    """``path`` fetched by a logged-in client of a UI on ``engine``; a server error is the
    response (500), not an exception in the test."""
    with TestClient(create_app(engine, TOKEN), follow_redirects=False, raise_server_exceptions=False) as client:
        client.post("/login", data={"token": TOKEN, "next": "/executions"})
        return client.get(path)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def ui_server(cluster: Any, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    log = tmp_path / "ui.log"
    env = dict(os.environ) | cluster.workers.env | {"DURABLE_UI_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "celery", "-A", "tests.apps.basic", "durable", "ui", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the UI exited with {proc.returncode}:\n{log.read_text()}")
            return _up(base + "/healthz")

        wait_until(ready, timeout=60, what="the UI server")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    text = log.read_text()
    assert TOKEN not in text, "the token given by the environment must never be printed"


@pytest.fixture
def artifacts() -> Path:
    # not under tmp_path: pytest keeps only its last few base temp dirs (other runs rotate them)
    root = os.environ.get("TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="celery-durable-artifacts-")
    folder = Path(root) / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots: {folder}")
    return folder
