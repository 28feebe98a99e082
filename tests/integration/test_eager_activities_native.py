"""An eager activity is a Celery task like a delivered one (issue 28): real ``celery worker``
processes show it in task events (what Flower and ``celery events`` read), ``revoke`` discards or
terminates it, and a warm shutdown ends the chain at the next step (sent, not kept), in a prefork
worker whose child runs it as in a threads worker."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps import eager
from tests.integration.eager_logs import eager_steps
from tests.integration.task_events import Events, process_gone
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.eager"


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    with cluster.client_of(eager, tmp_path / "marks") as durable:
        yield durable


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_eager_runs_send_the_task_events_a_delivery_does(cluster: Any, fx: Any, pool: str) -> None:
    # prefork: events enabled at run time, as Flower does (enable_events reaches the main process
    # only); threads: from the command line (-E)
    extra = ["-E"] if pool == "threads" else []
    worker = cluster.start_worker(app=APP, pool=pool, extra=extra, env={"TEST_EAGER_ACTIVITIES": "10"})
    with Events(eager.app) as events:
        if pool == "prefork":
            assert eager.app.control.enable_events(reply=True, timeout=10)
        h = eager.steps.start(3)
        assert h.result(timeout=60) == 3
        assert eager_steps(worker, h.id) == [1, 2, 3]  # every step ran eagerly ...
        for seq in (1, 2, 3):  # ... and each shows as a task: received, started, succeeded
            task_id = f"{h.id}:{seq}"
            wait_until(
                lambda task_id=task_id: events.types(task_id) == ["task-received", "task-started", "task-succeeded"],
                timeout=30,
                what=f"the events of {task_id} (seen {events.types(task_id)})",
            )
        succeeded = [e for e in events.seen if e["type"] == "task-succeeded" and e.get("uuid") == f"{h.id}:2"]
        assert succeeded[0]["hostname"].startswith(worker.name) and succeeded[0]["runtime"] >= 0
        received = [e for e in events.seen if e["type"] == "task-received" and e.get("uuid") == f"{h.id}:2"]
        # named as its message would be (the shadow name a delivered request takes)
        assert received[0]["name"] == f"{eager.inc.name} [eager.steps {h.id} #2]"
        assert received[0]["parent_id"] == f"{h.id}:1"


def test_no_events_when_the_worker_sends_none(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": "10"})
    with Events(eager.app) as events:
        assert eager.app.control.disable_events(reply=True, timeout=10)
        h = eager.steps.start(2)
        assert h.result(timeout=60) == 2
        assert eager_steps(worker, h.id) == [1, 2]
        probe = uuid.uuid4().hex  # every event sent before the probe has been received after it
        with eager.app.events.default_dispatcher() as dispatcher:
            dispatcher.send("custom-probe", probe=probe)
        wait_until(lambda: any(e.get("probe") == probe for e in events.seen), timeout=30, what="the probe")
        assert [e for e in events.seen if e["type"].startswith("task-")] == []


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_revoked_eager_activity_is_discarded_like_its_message(cluster: Any, fx: Any, pool: str) -> None:
    worker = cluster.start_worker(app=APP, pool=pool)
    key = uuid.uuid4().hex[:8]
    h = eager.gated_steps.start(key, 3)
    wait_until(lambda: (eager.MARKS / f"start-{key}-1").exists(), timeout=60, what="step 1 to start")
    assert eager.app.control.revoke(f"{h.id}:2", reply=True, timeout=10)  # the worker has it now
    (eager.MARKS / f"gate-{key}-1").touch()
    wait_until(lambda: f"Discarding revoked task: {eager.gated.name}[{h.id}:2]" in worker.log(), timeout=60)
    assert not (eager.MARKS / f"start-{key}-2").exists()  # discarded before it started
    assert eager_steps(worker, h.id) == [1]
    assert h.status() == "running"  # the step is left to recovery, as a discarded message is


def test_revoke_with_terminate_kills_the_child_running_an_eager_activity(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, pool="prefork")
    key = uuid.uuid4().hex[:8]
    (eager.MARKS).mkdir(parents=True, exist_ok=True)
    (eager.MARKS / f"gate-{key}-1").touch()
    h = eager.gated_steps.start(key, 3)
    start = eager.MARKS / f"start-{key}-2"
    wait_until(start.exists, timeout=60, what="step 2 to start")
    assert 2 in eager_steps(worker, h.id)  # it runs eagerly, in a pool child
    pid = int(start.read_text().split()[0])
    assert pid != worker.proc.pid
    assert eager.app.control.revoke(f"{h.id}:2", terminate=True, signal="SIGKILL", reply=True, timeout=10)

    wait_until(lambda: process_gone(pid), timeout=30, what=f"the child {pid} to be killed")
    assert "Terminating eager activity" in worker.log()
    (eager.MARKS / f"gate-{key}-2").touch()
    assert not (eager.MARKS / f"end-{key}-2").exists()


def test_a_warm_shutdown_sends_the_next_activity_instead_of_running_it(cluster: Any, fx: Any) -> None:
    first = cluster.start_worker(app=APP, pool="prefork")
    key = uuid.uuid4().hex[:8]
    eager.MARKS.mkdir(parents=True, exist_ok=True)
    (eager.MARKS / f"gate-{key}-1").touch()
    h = eager.gated_steps.start(key, 4)
    wait_until((eager.MARKS / f"start-{key}-2").exists, timeout=60, what="step 2 to start")
    first.proc.send_signal(signal.SIGTERM)  # warm: the running step finishes
    wait_until(lambda: "Warm shutdown" in first.log(), timeout=30, what="the warm shutdown")
    (eager.MARKS / f"gate-{key}-2").touch()
    first.proc.wait(30)  # it exits once step 2 is done: step 3 was sent, not run here
    assert not (eager.MARKS / f"start-{key}-3").exists()
    assert eager_steps(first, h.id) == [1, 2]
    for step in (3, 4):
        (eager.MARKS / f"gate-{key}-{step}").touch()
    cluster.start_worker(app=APP, pool="prefork")
    assert h.result(timeout=60) == 4


def test_a_process_killed_between_the_commit_and_the_kept_attempt_is_recovered_by_its_lease(
    cluster: Any, fx: Any
) -> None:
    # the queue timeout (300 s) far beyond the test's wait: only the lapsed lease (3 s) and the
    # recovery scan (1 s) can bring the step back
    env = {
        "TEST_LEASE_TTL": "3",
        "TEST_HEARTBEAT": "1",
        "TEST_RECOVERY_INTERVAL": "1",
        "TEST_QUEUE_TIMEOUT": "300",
        "TEST_DIE_BEFORE_START": "1",
    }
    worker = cluster.start_worker(app=APP, env=env)
    cluster.workers.start_beat(app=APP, env=env)
    key = uuid.uuid4().hex[:8]
    h = eager.kill_before.start(key)
    assert h.result(timeout=60) == 7  # inc(0)=1, after_kill: 6, inc: 7
    assert len((eager.MARKS / f"prerun-{key}").read_text().splitlines()) == 2
    assert len((eager.MARKS / f"ran-{key}").read_text().splitlines()) == 1
    marker = eager.durable.store.read(h.id, "s:000002")
    assert marker is not None and marker["lost"] == 1 and marker["attempts"] == 2
    assert 2 in eager_steps(worker, h.id)  # the first (killed) one was kept
