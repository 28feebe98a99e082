"""Issue 27 §2 on real ``celery worker`` processes: ``@durable_activity(pause_on_failure=True)``
failing for good pauses its execution (the step held, no outcome) instead of failing it; after the
fix, ``unpause`` re-sends the step and the workflow completes — on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_durable.engine.admin.pause import unpause
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_failure_for_good_pauses_and_the_unpause_completes_it(cluster: Any) -> None:
    marks = cluster.workers.tmp / "marks"
    cluster.workers.env.update(TEST_MARKS_DIR=str(marks))
    cluster.start_worker(concurrency=2)
    key = uuid.uuid4().hex[:8]
    h = basic.pauses_on_failure.start(key)
    engine = basic.durable.engine
    wait_until(lambda: bool(engine.read_exec(h.id).get("paused")), timeout=60, what="the failure to pause it")
    assert h.status() == "running"
    docs = engine.store.query_partition(h.id).docs
    assert not any(d.get("type") == "result" for d in docs)
    (held,) = [d for d in docs if d.get("held")]
    assert "is down" in held["last_error"]["message"]
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"fixed-{key}").touch()  # the fix
    assert unpause(engine, h.id, "ops")
    assert h.result(timeout=60) == f"served {key}!"
