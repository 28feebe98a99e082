"""Issue 26 §2 and §3 on real ``celery worker`` processes: Temporal's ``hello_cancellation`` (a
heartbeating activity stopped by the workflow's cancel, its cleanup run), heartbeat details that
survive a SIGKILLed worker (the next attempt resumes from them), and a stalled attempt failed
early by its ``heartbeat_timeout`` and retried by its options."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_durable.errors import WorkflowCancelledError
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

FAST = {
    "TEST_LEASE_TTL": "3",
    "TEST_HEARTBEAT": "0.5",
    "TEST_RECOVERY_INTERVAL": "1",
    "TEST_DRIVE_TIMEOUT": "3",
    "TEST_QUEUE_TIMEOUT": "6",
}


def _count(cluster: Any, name: str) -> int:
    path = cluster.workers.tmp / "marks" / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def _marks(cluster: Any, prefix: str) -> list[str]:
    folder = cluster.workers.tmp / "marks"
    return sorted(p.name for p in folder.glob(f"{prefix}*")) if folder.exists() else []


@pytest.fixture
def fast(cluster: Any) -> Any:
    cluster.workers.env.update(FAST, TEST_MARKS_DIR=str(cluster.workers.tmp / "marks"))
    return cluster


def _heartbeat_details(eid: str) -> Any:
    for doc in basic.durable.engine.store.query_partition(eid).docs:
        if doc.get("type") == "step" and doc.get("kind") == "activity" and doc.get("heartbeat"):
            return doc["heartbeat"].get("details")
    return None


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_hello_cancellation(fast: Any) -> None:
    """The activity learns of the cancel at a heartbeat, the workflow's ``finally`` runs its
    cleanup activity, and the execution ends cancelled."""
    fast.start_worker(concurrency=2)
    key = uuid.uuid4().hex[:8]
    handle = basic.hello_cancellation.start(key)
    wait_until(lambda: _count(fast, f"hb-start-{key}") == 1, timeout=30, what="the activity to start")
    assert handle.cancel()
    with pytest.raises(WorkflowCancelledError):
        handle.result(timeout=60)
    # it stops by ActivityCancelled at a heartbeat after a renewal (every 0.5 s here) saw the cancel
    wait_until(lambda: _count(fast, f"hb-cancelled-{key}") == 1, timeout=30, what="the activity to stop")
    assert _count(fast, f"hb-cleanup-{key}") == 1
    assert _count(fast, f"hb-start-{key}") == 1  # never run again


def test_a_cancel_reaches_the_activity_while_the_only_worker_runs_it(fast: Any) -> None:
    """One worker, one process, busy with the activity: no drive can deliver the cancel until the
    activity ends, so the attempt learns of it from the exec's cancel request itself."""
    fast.start_worker(concurrency=1)
    key = uuid.uuid4().hex[:8]
    handle = basic.hello_cancellation.start(key)
    wait_until(lambda: _count(fast, f"hb-start-{key}") == 1, timeout=30, what="the activity to start")
    assert handle.cancel()
    with pytest.raises(WorkflowCancelledError):
        handle.result(timeout=60)
    wait_until(lambda: _count(fast, f"hb-cancelled-{key}") == 1, timeout=30, what="the activity to stop")
    assert _count(fast, f"hb-cleanup-{key}") == 1


def test_heartbeat_details_survive_a_killed_worker(fast: Any) -> None:
    victim = fast.start_worker(concurrency=1)
    key = uuid.uuid4().hex[:8]
    handle = basic.importer.start(key, 400)  # 20 s of rows
    wait_until(lambda: (_heartbeat_details(handle.id) or 0) >= 10, timeout=60, what="progress to be recorded")
    victim.kill()
    fast.start_worker(concurrency=1)
    fast.workers.start_beat()
    resumed_from = handle.result(timeout=120)
    assert resumed_from >= 10  # the second attempt started where the first's heartbeat got to
    assert _marks(fast, f"imp-{key}-") == sorted([f"imp-{key}-0", f"imp-{key}-{resumed_from}"])


def test_a_stalled_attempt_is_failed_early_and_retried(fast: Any) -> None:
    fast.start_worker(concurrency=1)
    key = uuid.uuid4().hex[:8]
    handle = basic.stalling.start(key)
    # the first attempt is stuck for 60 s: only its 1 s heartbeat_timeout ends it in time
    assert handle.result(timeout=40) == "attempt 2"
