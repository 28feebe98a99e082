"""Issue 26 §4 on real ``celery worker`` and ``celery beat`` processes on SQLite: a deadline is
enforced by beat's clock scan (the workflow's compensation runs once, status ``timed_out``), and a
delayed start is ``scheduled`` until its clock fires, then runs."""

from __future__ import annotations

import pytest

from celery_durable import WorkflowTimedOutError
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

ENV = {"TEST_CLOCK_INTERVAL": "0.5"}


def _marks(cluster, key: str) -> int:  # type: ignore[no-untyped-def]
    path = cluster.workers.tmp / "marks" / key
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_deadline_and_a_delayed_start_on_real_workers(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker(env=ENV)
    cluster.workers.start_beat(env=ENV)
    store = cluster.durable.store

    timed = basic.deadlined.options(timeout=2.0).start("dl")
    later = basic.sleeper.options(start_delay=3.0).start("later", 0.1)
    assert later.status() == "scheduled"  # created at start(), not driven yet
    exec_doc = store.read(later.id, "exec")
    assert exec_doc is not None and exec_doc["start_at"] > exec_doc["created_at"]

    with pytest.raises(WorkflowTimedOutError):
        timed.result(timeout=60)
    assert timed.status() == "timed_out"
    wait_until(lambda: _marks(cluster, "compensated-dl") == 1, timeout=30, what="the compensation to run")
    ended = store.read(timed.id, "exec")
    assert ended is not None
    # enforced within a few scan intervals (0.5 s) of the deadline, never before it
    assert 0 <= ended["completed_at"] - ended["deadline_at"] < 10

    assert later.result(timeout=60) >= 0
    assert _marks(cluster, "woke-later") == 1
    first_step = store.read(later.id, "s:000001")
    assert first_step is not None and first_step["created_at"] >= exec_doc["start_at"]
    assert _marks(cluster, "compensated-dl") == 1  # once, whatever the scans and drives did
