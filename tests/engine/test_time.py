"""Timers, signals, children, cancellation, sagas and continue-as-new on a fake clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_durable import ActivityError, ChildWorkflowError, Durable, DurableTimeoutError, durable_activity
from celery_durable import workflow as wf
from celery_durable.errors import PayloadValidationError, WorkflowCancelledError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("time-tests", set_as_current=False)
durable = Durable(app, store="memory://")
LOG: list[str] = []


class Approval(BaseModel):
    ok: bool
    by: str


@durable_activity(name="t.record")
def record(what: str) -> str:
    LOG.append(what)
    return what


@durable_activity(name="t.fail")
def fail(what: str) -> str:
    LOG.append(f"fail:{what}")
    raise RuntimeError(f"{what} broke")


@durable.workflow(name="t.long_sleep")
def long_sleep(days: int) -> float:
    start = wf.now()
    wf.sleep(timedelta(days=days))
    record("woke")
    return (wf.now() - start).total_seconds()


@durable.workflow(name="t.approval", signals={"approval": Approval})
def approval_flow(timeout_days: int) -> str:
    try:
        got = wf.wait_signal("approval", timeout=timedelta(days=timeout_days))
    except DurableTimeoutError:
        return "timed out"
    return f"{got.by}:{got.ok}"


@durable.workflow(name="t.child")
def child(n: int) -> int:
    if n < 0:
        raise ValueError("negative")
    wf.sleep(timedelta(hours=n))
    return n * 10


@durable.workflow(name="t.parent")
def parent(ns: list[int]) -> list[int]:
    futures = [child.start_child(n) for n in ns]
    out = []
    for f in futures:
        try:
            out.append(f.result())
        except ChildWorkflowError as exc:
            assert exc.type_name == "ValueError"
            out.append(-1)
    return out


@durable.workflow(name="t.saga")
def saga_flow(fail_at: str) -> str:
    with wf.Saga() as saga:
        record("reserve")
        saga.add(record, "release")
        record("charge")
        saga.add(record, "refund")
        if fail_at == "ship":
            fail("ship")
        wf.sleep(timedelta(days=1))
        record("ship")
    return "shipped"


@durable.workflow(name="t.counter")
def counter(n: int, total: int) -> int:
    if n == 0:
        return total
    record(f"tick{n}")
    wf.continue_as_new(n - 1, total + n)
    return -1


@pytest.fixture
def env() -> WorkflowEnvironment:
    LOG.clear()
    return WorkflowEnvironment(durable)


def test_thirty_day_sleep_completes_without_waiting(env: WorkflowEnvironment) -> None:
    h = env.start(long_sleep, 30)
    assert h.status() == "running"
    assert env.result(h) == pytest.approx(30 * 86400, abs=1)
    assert LOG == ["woke"]


def test_signal_before_wait_is_kept(env: WorkflowEnvironment) -> None:
    h = env.start(approval_flow, 2)
    # already waiting; a signal sent now is delivered
    assert env.signal(h, "approval", Approval(ok=True, by="ann")) is True
    assert env.result(h) == "ann:True"
    assert env.signal(h, "approval", Approval(ok=False, by="bob")) is False  # finished: ignored


def test_second_signal_value_is_kept_for_a_later_wait(env: WorkflowEnvironment) -> None:
    wf_id = "appr-2"
    env.engine.start(approval_flow.definition, (2,), {}, workflow_id=wf_id)
    # not driven yet: both signals land before the workflow reaches the wait
    assert env.engine.signal(wf_id, "approval", {"ok": True, "by": "first"}) is True
    assert env.engine.signal(wf_id, "approval", {"ok": False, "by": "second"}) is True
    env.run_until_idle()
    assert env.result(env.handle(wf_id)) == "first:True"  # the one wait takes the first value


def test_bad_signal_value_fails_in_sender(env: WorkflowEnvironment) -> None:
    h = env.start(approval_flow, 2)
    with pytest.raises(PayloadValidationError):
        env.signal(h, "approval", {"ok": "maybe"})
    assert not [d for d in env.store.query_partition(h.id).docs if d.get("type") in ("signal", "signal_value")]
    assert h.status() == "running"


def test_signal_timeout_after_two_days(env: WorkflowEnvironment) -> None:
    h = env.start(approval_flow, 2)
    env.advance(timedelta(days=1, hours=23))
    assert h.status() == "running"
    env.advance(timedelta(hours=1))
    assert h.status() == "completed"
    assert env.result(h) == "timed out"
    assert env.signal(h, "approval", Approval(ok=True, by="late")) is False


@pytest.mark.parametrize("round_", range(200))
def test_timeout_races_signal_first_writer_wins(env: WorkflowEnvironment, round_: int) -> None:
    h = env.start(approval_flow, 1)
    env.clock.advance(86400)  # the timer is due, but not fired yet
    if round_ % 2:
        sent = env.engine.signal(h.id, "approval", Approval(ok=True, by="racer"))
        env.engine.timers.fire_due_clocks()
    else:
        env.engine.timers.fire_due_clocks()
        sent = env.engine.signal(h.id, "approval", Approval(ok=True, by="racer"))
    env.run_until_idle()
    assert env.result(h) == ("racer:True" if sent else "timed out")
    assert sent is bool(round_ % 2)


def test_children_complete_and_failures_are_catchable(env: WorkflowEnvironment) -> None:
    h = env.start(parent, [1, -1, 3])
    assert env.result(h) == [10, -1, 30]
    assert env.engine.read_exec(f"{h.id}-c1")["status"] == "completed"
    assert env.engine.read_exec(f"{h.id}-c2")["status"] == "failed"


def test_cancelling_parent_cancels_children(env: WorkflowEnvironment) -> None:
    h = env.start(parent, [5, 7])
    assert env.engine.read_exec(f"{h.id}-c1")["status"] == "running"
    env.cancel(h)
    assert h.status() == "cancelled"
    assert env.engine.read_exec(f"{h.id}-c1")["status"] == "cancelled"
    assert env.engine.read_exec(f"{h.id}-c2")["status"] == "cancelled"
    with pytest.raises(WorkflowCancelledError):
        h.result(timeout=0)


def test_saga_compensates_in_reverse_on_failure(env: WorkflowEnvironment) -> None:
    h = env.start(saga_flow, "ship")
    assert h.status() == "failed"
    assert LOG == ["reserve", "charge", "fail:ship", "refund", "release"]
    assert h.poll().error["type"] == "ActivityError"


def test_saga_compensates_on_cancel(env: WorkflowEnvironment) -> None:
    h = env.start(saga_flow, "never")
    assert h.status() == "running"  # sleeping for a day
    env.cancel(h)
    assert h.status() == "cancelled"
    assert LOG == ["reserve", "charge", "refund", "release"]
    env.skip_to_next_timer()  # the cancelled sleep's timer changes nothing
    assert LOG == ["reserve", "charge", "refund", "release"]


def test_crash_during_compensation_resumes_it(env: WorkflowEnvironment) -> None:
    h = env.start(saga_flow, "never")
    env.engine.cancel(h.id)
    # run the drive that delivers the cancel, then "crash": drop the queued refund message
    env.dispatcher.run_some(1)
    lost = [item for item in env.dispatcher.queue if item[0] == "activity"]
    assert len(lost) == 1 and lost[0][1].name == "t.record" and lost[0][1].args == ["refund"]
    env.dispatcher.queue.clear()
    assert h.status() == "running"
    # recovery re-sends the lost compensation after the queue timeout
    env.clock.advance(env.engine.settings.activity_queue_timeout + 1)
    report = env.engine.recovery.scan()
    assert report.resent == 1
    env.run_until_idle()
    assert h.status() == "cancelled"
    assert LOG == ["reserve", "charge", "refund", "release"]


def test_continue_as_new_resets_history(env: WorkflowEnvironment) -> None:
    h = env.start(counter, 5, 0)
    assert env.result(h) == 15
    ex = env.engine.read_exec(h.id)
    assert ex["run"] == 5 and ex["continued"] == 5
    ids = {d["id"] for d in env.store.query_partition(h.id).docs}
    assert not any(i.startswith(("s:", "s1:", "r:", "r1:")) for i in ids), ids
    assert LOG == ["tick5", "tick4", "tick3", "tick2", "tick1"]


def test_activity_error_inside_child_is_reported(env: WorkflowEnvironment) -> None:
    @durable.workflow(name="t.bad_child")
    def bad_child() -> str:
        return fail("deep")

    @durable.workflow(name="t.bad_parent")
    def bad_parent() -> str:
        try:
            return bad_child()
        except ChildWorkflowError as exc:
            return exc.type_name

    try:
        h = env.start(bad_parent)
        assert env.result(h) == "ActivityError"
    finally:
        durable.registry.workflows.pop("t.bad_child")
        durable.registry.workflows.pop("t.bad_parent")
    assert isinstance(ActivityError("a", "b", "c", 1), Exception)
