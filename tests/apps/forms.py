"""A Celery app for the activity-forms tests: ``celery -A tests.apps.forms worker``.

The forms a user copies from the README: ``@durable_activity`` stacked on ``@shared_task``
(with Celery retry options), ``async def`` activities (plain and stacked). Configured from the
environment like ``tests.apps.basic``; activities count their runs in ``$TEST_MARKS_DIR``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from celery import shared_task

from celery_durable import ActivityError, Durable, durable_activity
from tests.apps._common import env_app

app = env_app("forms")
durable = Durable(app)


def mark(name: str) -> int:
    """Append a line to a marks file (across processes); return how many lines it now has."""
    folder = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / name).open("a") as fh:
        fh.write(f"{os.getpid()}\n")
    return len((folder / name).read_text().splitlines())


@durable_activity
@shared_task(name="forms.shared_double", autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
def shared_double(key: str, x: int, failures: int) -> int:
    if mark(f"double-{key}") <= failures:
        raise ConnectionError("transient")
    return x * 2


@durable_activity(name="forms.always_down", autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0)
def always_down(key: str) -> str:
    mark(f"down-{key}")
    raise ConnectionError("service down")


@durable_activity(name="forms.async_fetch")
async def async_fetch(x: int) -> int:
    await asyncio.sleep(0.01)
    return x * 10


@durable_activity
@shared_task(name="forms.async_shared", autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
async def async_shared(key: str, failures: int) -> str:
    await asyncio.sleep(0)
    n = mark(f"async-{key}")
    if n <= failures:
        raise ConnectionError("transient")
    return f"async ok after {n}"


@durable.workflow(name="forms.shared_flow")
def shared_flow(key: str, x: int, failures: int) -> int:
    return shared_double(key, x, failures) + 1  # type: ignore[no-any-return]


@durable.workflow(name="forms.exhausted")
def exhausted(key: str) -> dict[str, Any]:
    try:
        always_down(key)
    except ActivityError as exc:
        return {"caught": exc.type_name, "attempts": exc.attempts}
    return {"caught": None}


@durable.workflow(name="forms.async_flow")
def async_flow(key: str, x: int) -> dict[str, Any]:
    return {"fetched": async_fetch(x), "shared": async_shared(key, 1)}
