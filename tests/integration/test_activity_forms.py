"""The activity forms a user copies from the README, on real ``celery worker`` processes:
``@durable_activity`` over ``@shared_task``, ``async def`` activities, and the test
environment retrying exactly as a worker does (issue 12)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.testing.env import WorkflowEnvironment
from tests.apps import forms

pytestmark = pytest.mark.worker

APP = "tests.apps.forms"


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    """The test process as a client of ``tests.apps.forms``, on the cluster's broker and store."""
    app = forms.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    forms.durable.configure(store=cluster.store_url)
    yield cluster
    forms.durable.configure(store=None)


def _marks(cluster: Any, name: str) -> int:
    path = Path(cluster.workers.tmp) / "marks" / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_shared_task_stacked_activity_retries_and_runs_on_a_worker(client: Any) -> None:
    client.start_worker(app=APP)
    h = forms.shared_flow.start("s1", 20, 1)
    assert h.result(timeout=60) == 41
    assert _marks(client, "double-s1") == 2  # its shared_task options: one autoretry
    result = forms.durable.store.read(h.id, "r:000001")
    assert result is not None and result["ok"] is True and result["attempts"] == 2


def test_environment_and_worker_agree_on_exhausted_retries(client: Any) -> None:
    client.start_worker(app=APP)
    on_worker = forms.exhausted.start("w1").result(timeout=60)
    env = WorkflowEnvironment(forms.durable)
    in_env = env.result(env.start(forms.exhausted, "e1"))
    assert on_worker == in_env == {"caught": "ConnectionError", "attempts": 3}
    assert _marks(client, "down-w1") == 3


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_async_activities_run_on_a_worker(client: Any, pool: str) -> None:
    client.start_worker(app=APP, pool=pool)
    h = forms.async_flow.start(f"a-{pool}", 4)
    assert h.result(timeout=60) == {"fetched": 40, "shared": "async ok after 2"}
    assert _marks(client, f"async-a-{pool}") == 2  # the stacked async task's autoretry ran
