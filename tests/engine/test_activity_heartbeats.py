"""Issue 26 §2 and §3 in the test environment: ``activity.heartbeat(details)``, the details an
attempt leaves for the next (``last_heartbeat_details``), ``heartbeat_timeout`` failing a stalled
attempt (retried by its options), and a cancel reaching a running attempt (at its next heartbeat,
or at once with ``cancellation="interrupt"``) while the cancel's compensations run on.

The environment runs an activity in the test's thread; the engine's heartbeat thread renews its
lease (every 50 ms here) as a worker's does, and a second thread cancels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from celery_durable import ActivityError, Durable, durable_activity
from celery_durable import activity as act
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.documents.schema import marker_id
from celery_durable.errors import ConfigurationError, DurableError, HeartbeatTimeoutError, WorkflowCancelledError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("heartbeats", broker="memory://", set_as_current=False)
app.conf.update(durable_heartbeat_interval=0.05, durable_lease_ttl=5.0)
durable = Durable(app, store="memory://")

seen: dict[str, list[Any]] = {}
#: the environment a test runs (its store is not ``durable``'s)
envs: list[WorkflowEnvironment] = []
started = threading.Event()


def note(key: str, value: Any) -> None:
    seen.setdefault(key, []).append(value)


def until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return False


@durable_activity(name="hb.resume", autoretry_for=(RuntimeError,), max_retries=2, default_retry_delay=0)
def resumable(rows: int) -> int:
    done = act.last_heartbeat_details(0)
    note("resume-from", (act.info().attempt, done))
    for n in range(done, rows):
        act.heartbeat(n + 1)
        if act.info().attempt == 1 and n == 2:
            raise RuntimeError("the connection dropped after row 3")
    return rows


@durable_activity(name="hb.written")
def written(key: str) -> str:
    act.heartbeat({"phase": "copy", "done": 5})
    info = act.info()
    store = envs[-1].engine.store

    def recorded() -> bool:
        marker = store.read(info.execution_id, marker_id(info.step, info.run)) or {}
        return (marker.get("heartbeat") or {}).get("details") == {"phase": "copy", "done": 5}

    return "written" if until(recorded) else "never written"


@durable_activity(name="hb.stalls", heartbeat_timeout=0.3, autoretry_for=(HeartbeatTimeoutError,), max_retries=1)
def stalls(key: str) -> str:
    n = act.info().attempt
    note(key, n)
    if n == 1:
        end = time.monotonic() + 20
        while time.monotonic() < end:  # busy, no heartbeat: the interrupt lands here
            pass
        return "never interrupted"
    act.heartbeat()
    return f"attempt {n}"


@durable_activity(name="hb.always_stalls", heartbeat_timeout=0.2)
def always_stalls(key: str) -> str:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        pass
    return "never interrupted"


@durable_activity(name="hb.long")
def long_job(key: str) -> str:
    started.set()
    end = time.monotonic() + 20
    try:
        while time.monotonic() < end:
            act.heartbeat()
            time.sleep(0.005)
    except act.ActivityCancelled as exc:
        note(key, f"cancelled: {exc.reason}")
        raise
    return "ran to its end"


@durable_activity(name="hb.busy", cancellation="interrupt")
def busy(key: str) -> str:
    started.set()
    end = time.monotonic() + 20
    try:
        while time.monotonic() < end:  # never heartbeats: only the interrupt stops it
            pass
    except act.ActivityCancelled:
        note(key, "interrupted")
        raise
    return "ran to its end"


@durable_activity(name="hb.cleanup")
def cleanup(key: str) -> str:
    # a compensation that heartbeats: the cancel it follows must not stop it
    for _ in range(30):
        act.heartbeat()
        time.sleep(0.005)
    note(key, "cleaned")
    return "cleaned"


@durable_activity(name="hb.unawaited")
def unawaited(key: str) -> str:
    """Heartbeats for a while; its workflow is cancelled meanwhile, waiting on something else."""
    started.set()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        act.heartbeat()
        time.sleep(0.005)
    return "finished"


@durable.workflow(name="hb.flow_unawaited")
def flow_unawaited(key: str) -> str:
    pending = unawaited.start(key)
    try:
        wf.sleep(3600)
    except WorkflowCancelledError:
        note(key, pending.result())  # the compensation awaits the activity the cancel did not
        raise
    return "slept"


@durable.workflow(name="hb.flow_resume")
def flow_resume(rows: int) -> int:
    return resumable(rows)


@durable.workflow(name="hb.flow_written")
def flow_written(key: str) -> str:
    return written(key)


@durable.workflow(name="hb.flow_stalls")
def flow_stalls(key: str) -> str:
    return stalls(key)


@durable.workflow(name="hb.flow_always_stalls")
def flow_always_stalls(key: str) -> str:
    try:
        return always_stalls(key)
    except ActivityError as exc:
        return exc.type_name


@durable.workflow(name="hb.flow_cancelled")
def flow_cancelled(key: str, interrupt: bool) -> str:
    try:
        return busy(key) if interrupt else long_job(key)
    except WorkflowCancelledError:
        cleanup(key)
        raise


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()
    started.clear()


def test_details_reach_the_next_attempt() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow_resume, 6)) == 6
    # attempt 1 failed after row 3; attempt 2 started from the details it left
    assert seen["resume-from"] == [(1, 0), (2, 3)]


def test_a_renewal_writes_the_details() -> None:
    env = WorkflowEnvironment(durable)
    envs.append(env)
    handle = env.start(flow_written, "w")
    assert env.result(handle) == "written"
    # shown by `durable show` and the UI's step table
    (step,) = [s for s in Admin(env.engine).describe(handle.id).steps if s.kind == "activity"]
    assert step.heartbeat == {"phase": "copy", "done": 5} and step.heartbeat_attempt == 1
    assert step.heartbeat_at is not None and step.heartbeat_at <= env.clock.now()


def test_a_stalled_attempt_times_out_and_is_retried_by_its_options() -> None:
    env = WorkflowEnvironment(durable)
    began = time.monotonic()
    assert env.result(env.start(flow_stalls, "s1")) == "attempt 2"
    assert seen["s1"] == [1, 2]
    assert time.monotonic() - began < 10  # interrupted near its 0.3 s timeout, not after 20 s


def test_a_stall_with_no_retry_left_fails_the_step() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow_always_stalls, "s2")) == "HeartbeatTimeoutError"


def _cancel_when_started(env: WorkflowEnvironment, eid: str) -> threading.Thread:
    def cancel() -> None:
        assert started.wait(10)
        env.engine.cancel(eid)

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread


@pytest.mark.parametrize("interrupt", [False, True], ids=["at-heartbeat", "interrupt"])
def test_a_cancel_stops_the_running_attempt_and_compensations_run(interrupt: bool) -> None:
    env = WorkflowEnvironment(durable)
    eid = f"hb-cancel-{interrupt}"
    thread = _cancel_when_started(env, eid)
    began = time.monotonic()
    env.start(flow_cancelled.options(workflow_id=eid), "c", interrupt)  # runs until idle
    thread.join(10)
    assert time.monotonic() - began < 10  # stopped, not run for its 20 s
    expected = "interrupted" if interrupt else "cancelled: the workflow was cancelled"
    assert seen["c"] == [expected, "cleaned"]
    assert env.engine.read_exec(eid)["status"] == "cancelled"


def test_a_cancel_leaves_an_activity_the_workflow_does_not_wait_on() -> None:
    """The cancel is delivered where the workflow waits (the sleep); the activity started before
    and not awaited runs on, and the compensation that awaits it gets its result."""
    env = WorkflowEnvironment(durable)
    eid = "hb-unawaited"
    thread = _cancel_when_started(env, eid)
    env.start(flow_unawaited.options(workflow_id=eid), "u")
    thread.join(10)
    env.run_until_idle()
    assert seen["u"] == ["finished"]
    assert env.engine.read_exec(eid)["status"] == "cancelled"


@durable.workflow(name="hb.flow_long")
def flow_long(key: str) -> str:
    return long_job(key)


def test_a_terminated_workflow_stops_its_running_attempt() -> None:
    env = WorkflowEnvironment(durable)
    eid = "hb-terminated"

    def terminate_when_started() -> None:
        assert started.wait(10)
        assert terminate(env.engine, eid, by="ops", reason="runaway import")

    thread = threading.Thread(target=terminate_when_started)
    thread.start()
    began = time.monotonic()
    env.start(flow_long.options(workflow_id=eid), "t")
    thread.join(10)
    assert time.monotonic() - began < 10
    assert seen["t"] == ["cancelled: the workflow is failed"]
    assert env.engine.read_exec(eid)["status"] == "failed"


def test_heartbeat_details_must_be_json() -> None:
    with pytest.raises(TypeError, match="JSON"):
        act.heartbeat({1, 2})  # outside an activity too: the same refusal
    with pytest.raises(TypeError, match="JSON"):
        act.heartbeat(float("nan"))
    act.heartbeat({"ok": [1, 2]})  # outside an activity: nothing to say it to


def test_info_outside_an_activity_is_an_error() -> None:
    with pytest.raises(DurableError, match="durable activity"):
        act.info()
    assert act.is_cancelled() is False


@pytest.mark.parametrize(
    "options",
    [
        {"heartbeat_timeout": 0},
        {"heartbeat_timeout": -1},
        {"heartbeat_timeout": float("nan")},
        {"heartbeat_timeout": float("inf")},
        {"heartbeat_timeout": "30"},
        {"heartbeat_timeout": True},
        {"cancellation": "never"},
        {"local": True, "heartbeat_timeout": 5},
    ],
)
def test_bad_options_are_refused_at_declaration(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):

        @durable_activity(name=f"hb.bad.{len(seen)}", **options)
        def bad() -> None: ...


slow_app = Celery("heartbeats-slow", broker="memory://", set_as_current=False)
slow_app.conf.update(durable_heartbeat_interval=8.0, durable_lease_ttl=30.0)  # renewals far apart
slow = Durable(slow_app, store="memory://")


@durable_activity(name="hb.quick")
def quick(key: str) -> str:
    # the heartbeat thread has planned its next look (this attempt's renewal, 8 s away)
    assert until(lambda: envs[-1].engine.heartbeat._planned is not None)
    return key


@slow.workflow(name="hb.flow_stalls_between_renewals")
def flow_stalls_between_renewals(key: str) -> str:
    quick(key)  # the heartbeat thread runs, asleep until its next look (8 s away)
    try:
        return always_stalls(key)
    except ActivityError as exc:
        return exc.type_name


def test_a_stall_is_noticed_at_its_timeout_not_at_the_next_renewal() -> None:
    """A 0.2 s heartbeat_timeout with renewals 8 s apart: the heartbeat thread wakes for the
    stall deadline, it does not sleep until the renewal."""
    env = WorkflowEnvironment(slow)
    envs.append(env)
    began = time.monotonic()
    assert env.result(env.start(flow_stalls_between_renewals, "s3")) == "HeartbeatTimeoutError"
    assert time.monotonic() - began < 4


def test_a_deadline_stops_the_running_attempt_and_compensations_run() -> None:
    """Issue 26 §3 with §4: the workflow's deadline passes while its activity runs; beat's clock
    scan (here a second thread) ends the wait with WorkflowTimedOutError, the attempt is told at
    its next heartbeat, the compensation runs and the execution ends timed_out."""
    env = WorkflowEnvironment(durable)
    eid = "hb-deadline"

    def scan_after_the_deadline() -> None:
        assert started.wait(10)
        env.clock.advance(120)  # past the 60 s deadline
        env.engine.timers.fire_due_clocks()

    thread = threading.Thread(target=scan_after_the_deadline)
    thread.start()
    began = time.monotonic()
    env.start(flow_cancelled.options(workflow_id=eid, timeout=60), "d", False)
    thread.join(10)
    env.run_until_idle()
    assert time.monotonic() - began < 10
    assert seen["d"] == ["cancelled: the workflow timed out", "cleaned"]
    assert env.engine.read_exec(eid)["status"] == "timed_out"
