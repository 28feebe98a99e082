"""Workflow deadlines and delayed starts (``options(timeout=, start_delay=)``: engine/starts/deadlines.py),
on ``WorkflowEnvironment``'s fake clock: a deadline raises ``WorkflowTimedOutError`` at the suspension
point the workflow waits at (a sleep, a signal wait, a running activity whose later result is
ignored), compensations run, the execution ends ``timed_out``; a child's deadline is capped by its
parent's; a delayed start is ``scheduled`` until its clock fires; bad inputs fail at ``start()``."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, WorkflowCancelledError, WorkflowTimedOutError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.schema import EXEC_ID, TERMINAL, Status
from celery_durable.engine.starts.deadlines import DEADLINE_CLOCK, START_CLOCK
from celery_durable.errors import ConfigurationError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("deadline-tests", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")

#: what the workflows and activities of a test did, in order
LOG: list[str] = []
#: the environment a test runs (the "slow" activity moves its clock while it runs)
ENV: dict[str, WorkflowEnvironment] = {}


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    LOG.clear()
    ENV.clear()
    yield
    ENV.clear()


@durable_activity(name="dl.charge")
def charge(order: str) -> str:
    LOG.append(f"charge {order}")
    return f"ch-{order}"


@durable_activity(name="dl.refund")
def refund(charge_id: str) -> str:
    LOG.append(f"refund {charge_id}")
    return f"refunded {charge_id}"


@durable_activity(name="dl.slow")
def slow(seconds: float) -> str:
    """Runs ``seconds`` on the fake clock, during which beat's clock scan runs (the deadline passes)."""
    env = ENV["env"]
    env.clock.t += seconds
    env.engine.timers.fire_due_clocks()  # the scan, while this attempt still runs
    LOG.append("slow done")
    return "slow result"


@durable.workflow(name="dl.sleeper")
def sleeper(order: str) -> str:
    ch = charge(order)
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        refund(ch)  # a compensation: an activity, run after the deadline
        raise
    return "slept"


@durable.workflow(name="dl.waiter", signals={"go": str})
def waiter() -> str:
    try:
        return str(wf.wait_signal("go"))
    finally:
        LOG.append("finally ran")


@durable.workflow(name="dl.saga")
def saga_flow(order: str) -> str:
    with wf.Saga() as saga:
        ch = charge(order)
        saga.add(refund, ch)
        return slow(100.0)


@durable.workflow(name="dl.catcher")
def catcher() -> str:
    try:
        wf.sleep(3600)
    except WorkflowCancelledError as exc:  # a timeout is a cancel: caught, the code goes on
        return f"caught {type(exc).__name__}"
    return "slept"


@durable.workflow(name="dl.quick")
def quick(order: str) -> str:
    return charge(order)


@durable.workflow(name="dl.kid")
def kid() -> str:
    try:
        wf.sleep(10_000)
    finally:
        LOG.append("kid finally")
    return "kid done"


@durable.workflow(name="dl.parent")
def parent(kid_timeout: float | None) -> str:
    opts = kid.options(timeout=kid_timeout) if kid_timeout is not None else kid.options()
    return opts.start_child().result()


@durable.workflow(name="dl.generations")
def generations(n: int) -> int:
    wf.sleep(30)
    if n > 0:
        wf.continue_as_new(n - 1)
    return n


def _env() -> WorkflowEnvironment:
    env = WorkflowEnvironment(durable, start=1_000_000.0)
    ENV["env"] = env
    return env


def _ex(env: WorkflowEnvironment, eid: str) -> dict[str, Any]:
    doc = env.store.read(eid, EXEC_ID)
    assert doc is not None
    return doc


# --- deadlines ------------------------------------------------------------------------------------


def test_a_deadline_during_a_sleep_raises_there_runs_the_compensation_and_ends_timed_out() -> None:
    env = _env()
    h = env.start(sleeper.options(timeout=60), "o1")
    assert h.status() == "running"
    env.advance(59)
    assert h.status() == "running" and LOG == ["charge o1"]
    env.advance(1)
    assert h.status() == Status.TIMED_OUT == "timed_out"
    assert LOG == ["charge o1", "refund ch-o1"]  # the except ran its compensation, once
    with pytest.raises(WorkflowTimedOutError):
        h.result(timeout=0)
    assert isinstance(WorkflowTimedOutError("x"), WorkflowCancelledError)
    ex = _ex(env, h.id)
    assert ex["deadline_at"] == 1_000_060.0 and ex["timed_out"] is True
    assert h.poll().deadline_at == 1_000_060.0 and h.poll().start_at is None
    assert ex["error"]["type"] == "WorkflowTimedOutError"
    clock = env.store.read(h.id, DEADLINE_CLOCK)
    assert clock is not None and clock["due_kind"] is None and clock["fired_at"] == 1_000_060.0


def test_a_deadline_during_a_signal_wait_ends_it_and_a_later_signal_is_refused() -> None:
    env = _env()
    h = env.start(waiter.options(timeout=timedelta(minutes=5)))
    env.advance(299)
    assert h.status() == "running" and LOG == []
    env.advance(1)
    assert h.status() == "timed_out"
    assert "finally ran" in LOG  # workflow code (not a durable step): it may run again on a replay
    assert env.signal(h, "go", "late") is False  # ended: nothing waits for it


def test_a_deadline_while_an_activity_runs_ends_the_workflow_there_and_its_result_is_ignored() -> None:
    env = _env()
    h = env.start(saga_flow.options(timeout=50), "o2")
    # the slow activity ran 100 s, the deadline fired at 50 s in the middle of it
    assert h.status() == "timed_out"
    assert LOG == ["charge o2", "slow done", "refund ch-o2"]  # the saga compensated
    outcomes = [d for d in env.store.query_partition(h.id).docs if d.get("type") == "result"]
    slow_outcome = next(d for d in outcomes if d.get("seq") == 2)
    assert slow_outcome["error"]["type"] == "WorkflowTimedOutError"  # not "slow result": first writer wins
    assert "value" not in slow_outcome or slow_outcome.get("value") is None


def test_code_that_catches_the_timeout_ends_as_it_decides() -> None:
    env = _env()
    h = env.start(catcher.options(timeout=10))
    env.advance(10)
    assert h.status() == "completed"
    assert h.result(timeout=0) == "caught WorkflowTimedOutError"


def test_a_workflow_that_ends_before_its_deadline_is_untouched_and_its_clock_settles() -> None:
    env = _env()
    h = env.start(quick.options(timeout=30), "o3")
    assert h.result(timeout=0) == "ch-o3"
    env.advance(31)
    assert h.status() == "completed"
    clock = env.store.read(h.id, DEADLINE_CLOCK)
    assert clock is not None and clock["due_kind"] is None
    assert env.engine.timers.next_clock() is None  # nothing left for the scan


def test_a_childs_deadline_is_capped_by_its_parents() -> None:
    env = _env()
    h = env.start(parent.options(timeout=100), 1000.0)  # the child's own 1000 s is later: capped at 100
    child_id = next(pk for pk in env.store.scan_partitions("", 50) if pk != h.id)
    assert _ex(env, child_id)["deadline_at"] == _ex(env, h.id)["deadline_at"] == 1_000_100.0
    env.advance(100)
    assert h.status() == "timed_out"
    assert _ex(env, child_id)["status"] in ("timed_out", "cancelled")
    assert "kid finally" in LOG


def test_a_capped_childs_clock_fired_first_still_times_the_parent_out_first() -> None:
    """The scan may reach the child's clock before its parent's (another order, a failed firing):
    the parent's is fired first, so the parent ends timed_out, not failed by its child's timeout."""
    from celery_durable.engine.starts.deadlines import fire_exec_clock

    env = _env()
    h = env.start(parent.options(timeout=100), None)
    child_id = next(pk for pk in env.store.scan_partitions("", 50) if pk != h.id)
    env.clock.t += 100
    assert fire_exec_clock(env.engine, child_id, DEADLINE_CLOCK) == "fired"
    assert _ex(env, h.id)["timed_out"] is True  # the parent's, recorded before the child's
    env.run_until_idle()
    assert h.status() == "timed_out"
    with pytest.raises(WorkflowTimedOutError):
        h.result(timeout=0)


def test_a_childs_own_earlier_deadline_wins_and_the_parent_gets_its_failure() -> None:
    env = _env()
    h = env.start(parent.options(timeout=100), 20.0)
    child_id = next(pk for pk in env.store.scan_partitions("", 50) if pk != h.id)
    assert _ex(env, child_id)["deadline_at"] == 1_000_020.0
    env.advance(20)
    assert _ex(env, child_id)["status"] == "timed_out"
    assert h.status() == "failed"  # the child's timeout is a ChildWorkflowError in the parent
    assert _ex(env, h.id)["error"]["type"] == "ChildWorkflowError"


def test_a_child_of_a_parent_without_deadline_gets_none_unless_its_own() -> None:
    env = _env()
    h = env.start(parent, None)
    child_id = next(pk for pk in env.store.scan_partitions("", 50) if pk != h.id)
    assert "deadline_at" not in _ex(env, child_id)
    assert env.store.read(child_id, DEADLINE_CLOCK) is None


def test_a_duplicated_or_early_clock_cannot_fire_twice_or_early() -> None:
    env = _env()
    h = env.start(sleeper.options(timeout=60), "o4")
    timers = env.engine.timers
    from celery_durable.engine.starts.deadlines import fire_exec_clock

    assert fire_exec_clock(env.engine, h.id, DEADLINE_CLOCK) == "early"  # a delivery ahead of its time
    assert h.status() == "running"
    env.clock.t += 60
    assert timers.fire_due_clocks() == 1
    assert fire_exec_clock(env.engine, h.id, DEADLINE_CLOCK) == "done"  # the duplicate: nothing more
    assert timers.fire_due_clocks() == 0
    env.run_until_idle()
    assert h.status() == "timed_out" and LOG == ["charge o4", "refund ch-o4"]


def test_a_timing_out_drive_marks_nothing_before_the_deadline_or_once_it_was_lifted() -> None:
    env = _env()
    h = env.start(waiter.options(timeout=60))
    env.engine.driver.drive(h.id, timing_out=True)  # early (a skewed clock): nothing is marked
    assert not _ex(env, h.id).get("timed_out")
    doc = env.store.read(h.id, EXEC_ID)
    assert doc is not None
    lifted = {k: v for k, v in doc.items() if k != "_etag"} | {"deadline_at": None}
    env.store.replace(lifted, if_match=doc["_etag"])  # lifted (an operator's re-run, say)
    env.clock.t += 60
    env.engine.driver.drive(h.id, timing_out=True)
    assert not _ex(env, h.id).get("timed_out") and h.status() == "running"


def test_a_lost_drive_after_the_deadline_cannot_skip_it() -> None:
    """Every drive message is lost once the deadline passed: the clock scan itself drives the
    timeout into the store, so the execution is timed out regardless."""
    env = _env()
    h = env.start(waiter.options(timeout=60))
    env.dispatcher.handlers["drive"] = lambda *a, **k: None  # drives are lost from here on
    env.advance(60)
    ex = _ex(env, h.id)
    assert ex["timed_out"] is True and ex["status"] == "timed_out"
    assert "finally ran" in LOG


def test_a_store_failure_while_firing_leaves_the_deadline_due_for_the_next_scan() -> None:
    from celery_durable.errors import StoreUnavailable

    env = _env()
    h = env.start(waiter.options(timeout=60))
    real = env.store.batch
    calls = {"n": 0}

    def failing(pk: str, ops: Any) -> Any:
        calls["n"] += 1
        raise StoreUnavailable("injected")

    env.store.batch = failing  # type: ignore[method-assign]
    env.clock.t += 60
    env.engine.timers.fire_due_clocks()  # fails (logged): nothing recorded
    assert calls["n"] >= 1
    env.store.batch = real  # type: ignore[method-assign]
    assert _ex(env, h.id)["status"] == "running"
    assert env.store.read(h.id, DEADLINE_CLOCK)["due_kind"] == "clock"  # type: ignore[index]
    env.advance(0)
    assert h.status() == "timed_out"


def test_resume_of_a_timed_out_execution_lifts_its_deadline() -> None:
    env = _env()
    h = env.start(waiter.options(timeout=60))
    env.advance(60)
    assert h.status() == "timed_out"
    Admin(env.engine).resume(h.id)
    env.run_until_idle()
    ex = _ex(env, h.id)
    assert ex["status"] == "running" and ex.get("deadline_at") is None and not ex.get("timed_out")
    env.advance(3600)
    assert h.status() == "running"
    env.signal(h, "go", "now")
    assert h.result(timeout=0) == "now"


def test_a_deadline_spans_continue_as_new_runs() -> None:
    env = _env()
    h = env.start(generations.options(timeout=100), 10)  # 11 runs of 30 s: the deadline ends run 3
    for _ in range(99):
        env.advance(1)
    assert h.status() == "running" and _ex(env, h.id)["run"] == 3
    env.advance(1)
    assert h.status() == "timed_out" and _ex(env, h.id)["run"] == 3


def test_reset_of_a_timed_out_execution_runs_it_again_without_deadline() -> None:
    env = _env()
    h = env.start(sleeper.options(timeout=60), "o8")
    env.advance(60)
    assert h.status() == "timed_out" and LOG == ["charge o8", "refund ch-o8"]
    Admin(env.engine).reset(h.id, 2)  # from the sleep: the charge is kept
    env.run_until_idle()
    assert h.status() == "running" and _ex(env, h.id).get("deadline_at") is None
    env.advance(3600)
    assert h.result(timeout=0) == "slept" and LOG == ["charge o8", "refund ch-o8"]


def test_latest_wins_over_a_scheduled_holder_cancels_it_before_it_ran() -> None:
    env = _env()
    first = env.start(quick.options(start_delay=60, dedup_key="dl-key"), "o9")
    second = env.start(quick.options(dedup_key="dl-key", on_conflict="latest-wins"), "o10")
    assert first.status() == "cancelled" and second.result(timeout=0) == "ch-o10"
    env.advance(60)
    assert first.status() == "cancelled" and LOG == ["charge o10"]


def test_timed_out_is_terminal_and_listed() -> None:
    env = _env()
    h = env.start(waiter.options(timeout=60))
    env.advance(60)
    assert Status.TIMED_OUT in TERMINAL
    assert [e.id for e in env.list_executions(status="timed_out").executions] == [h.id]
    assert h.poll().done


# --- delayed starts ------------------------------------------------------------------------------


def test_a_delayed_start_is_scheduled_then_runs_when_its_clock_fires() -> None:
    env = _env()
    h = env.start(quick.options(start_delay=300, workflow_id="later-1"), "o5")
    assert h.id == "later-1" and h.status() == Status.SCHEDULED == "scheduled"
    assert h.poll().start_at == 1_000_300.0 and not h.poll().done
    assert [e.id for e in env.list_executions(status="scheduled").executions] == ["later-1"]
    assert LOG == []
    env.advance(299)
    assert h.status() == "scheduled" and LOG == []
    env.advance(1)
    assert h.result(timeout=0) == "ch-o5" and LOG == ["charge o5"]
    clock = env.store.read(h.id, START_CLOCK)
    assert clock is not None and clock["due_kind"] is None


def test_a_signal_sent_to_a_scheduled_execution_waits_for_its_first_wait() -> None:
    env = _env()
    h = env.start(waiter.options(start_delay=60))
    assert env.signal(h, "go", "early bird") is True
    assert h.status() == "scheduled"  # a signal does not start it
    env.advance(60)
    assert h.result(timeout=0) == "early bird"


def test_a_timeout_counts_from_the_delayed_start() -> None:
    env = _env()
    h = env.start(waiter.options(start_delay=100, timeout=50))
    assert _ex(env, h.id)["deadline_at"] == 1_000_150.0
    env.advance(100)  # started on time
    assert h.status() == "running"
    env.advance(40)
    assert h.status() == "running"
    env.advance(10)
    assert h.status() == "timed_out"


def test_cancel_of_a_scheduled_execution_ends_it_before_any_code_runs() -> None:
    env = _env()
    h = env.start(sleeper.options(start_delay=60), "o6")
    assert env.cancel(h) is True
    assert h.status() == "cancelled"
    with pytest.raises(WorkflowCancelledError):
        h.result(timeout=0)
    env.advance(120)
    assert h.status() == "cancelled" and LOG == []  # its start clock found it ended
    assert env.store.read(h.id, START_CLOCK)["due_kind"] is None  # type: ignore[index]
    ops = [d for d in env.store.query_partition(h.id).docs if d.get("type") == "operation"]
    assert [o["kind"] if "kind" in o else o.get("op") for o in ops]  # the operator's cancel is recorded


def test_a_duplicated_start_clock_starts_it_once() -> None:
    from celery_durable.engine.starts.deadlines import fire_exec_clock

    env = _env()
    h = env.start(quick.options(start_delay=10), "o7")
    assert fire_exec_clock(env.engine, h.id, START_CLOCK) == "early"
    env.clock.t += 10
    assert fire_exec_clock(env.engine, h.id, START_CLOCK) == "fired"
    assert fire_exec_clock(env.engine, h.id, START_CLOCK) == "done"
    env.run_until_idle()
    assert h.result(timeout=0) == "ch-o7" and LOG == ["charge o7"]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": -1}, "timeout must be > 0"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"timeout": math.nan}, "finite"),
        ({"timeout": math.inf}, "finite"),
        ({"timeout": "60"}, "seconds"),
        ({"timeout": True}, "seconds"),
        ({"start_delay": -0.5}, "start_delay must be >= 0"),
        ({"start_delay": float("-inf")}, "finite"),
        ({"start_delay": [1]}, "seconds"),
        ({"timeout": timedelta(seconds=-3)}, "timeout must be > 0"),
        ({"timeout": 1e300}, "at most"),
        ({"start_delay": timedelta(days=365 * 101)}, "at most"),
    ],
)
def test_bad_timeouts_and_delays_fail_in_the_caller_before_anything_is_stored(
    options: dict[str, Any], words: str
) -> None:
    env = _env()
    with pytest.raises(ConfigurationError, match=words):
        env.start(quick.options(workflow_id="never", **options), "x")
    assert env.store.read("never", EXEC_ID) is None


def test_a_child_start_delay_is_refused_in_the_workflow() -> None:
    @durable.workflow(name="dl.delayed_child_parent")
    def delayed_child_parent() -> str:
        return kid.options(start_delay=5).start_child().result()

    env = _env()
    h = env.start(delayed_child_parent)
    assert h.status() == "failed"
    assert "start_delay is for top-level starts" in _ex(env, h.id)["error"]["message"]
