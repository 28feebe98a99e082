"""Outside a workflow an activity is an ordinary Celery task (``.delay()``, direct call).

Uses Celery's own pytest plugin (``celery.contrib.pytest``): its in-process ``celery_worker``.
Its fixtures are imported here explicitly (as a user would declare the plugin): pytest-celery,
which would replace ``celery_worker`` with a Docker-based one, is not a dependency.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.contrib.pytest import (  # noqa: F401 - fixtures
    celery_app,
    celery_config,
    celery_enable_logging,
    celery_includes,
    celery_parameters,
    celery_worker,
    celery_worker_parameters,
    celery_worker_pool,
    use_celery_app_trap,
)

from tests.apps import basic


@pytest.fixture
def celery_config() -> dict[str, Any]:  # noqa: F811 - overrides the plugin's default
    return {"broker_url": "memory://", "result_backend": "cache+memory://", "task_serializer": "json"}


def test_activity_delay_runs_as_a_plain_task(celery_app, celery_worker) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    task = celery_app.tasks[basic.add.name]
    assert task.delay(2, 3).get(timeout=10) == 5
    assert task.apply_async(args=(40, 2)).get(timeout=10) == 42


def test_activity_direct_call_is_plain() -> None:
    assert basic.add(1, 2) == 3
    assert basic.stacked(4) == 8
