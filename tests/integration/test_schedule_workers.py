"""Managed schedules (issue 27 §1) on real ``celery worker`` and ``celery beat`` processes, on
SQLite, PostgreSQL and the Cosmos test server: a schedule created from a client process
(``durable.schedules.create``, no ``beat_schedule`` entry) is fired by beat's clock scan every
second, and its executions complete on the worker; paused, no scan reads it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from celery_durable.engine.schedules.firing import SCHEDULES_PK, schedule_id
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


def _completed(name: str) -> list[str]:
    page = basic.durable.list_executions(workflow="ticker", limit=200)
    return sorted(e.id for e in page.executions if e.id.startswith(name + "@") and e.status == "completed")


@pytest.mark.parametrize(
    "cluster",
    [
        pytest.param(("redis", "sqlite"), id="redis-sqlite"),
        pytest.param(("redis", "postgres"), id="redis-postgres"),
        pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
    ],
    indirect=True,
)
def test_a_schedule_in_the_store_fires_every_second_through_beat(cluster: Any) -> None:
    env = {"TEST_CLOCK_INTERVAL": "0.3"}
    cluster.start_worker(env=env, concurrency=2)
    cluster.workers.start_beat(env=env)
    name = f"every-second-{uuid.uuid4().hex[:6]}"
    basic.durable.schedules.create(name, basic.ticker, name, every=timedelta(seconds=1), overlap="allow_all")
    wait_until(lambda: len(_completed(name)) >= 3, timeout=60, what="three ticks to complete")
    info = basic.durable.schedules.get(name)
    assert info is not None and info.kind == "managed" and info.counts.get("started", 0) >= 3
    # one execution per tick: ids are whole seconds, each a tick of its own
    done = _completed(name)
    assert len(done) == len(set(done)) and all(len(e.rsplit("@", 1)[1]) == len("20260101T000000") for e in done)

    assert basic.durable.schedules.pause(name, reason="enough")
    # paused, it is due for no scan: beat's clock scan never reads it again until resumed
    doc = basic.durable.store.read(SCHEDULES_PK, schedule_id(name))
    assert doc is not None and doc["due_kind"] is None and doc["due_at"] is None
