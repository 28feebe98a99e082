"""Attacks on workflow deadlines and delayed starts (``options(timeout=, start_delay=)``,
docs/guides/deadlines.md, engine/starts/deadlines.py).

Each failing test asserts a promise of the guide (or of docs/architecture.md / limitations.md) and
says in its docstring what was observed, what was expected and where the cause is. The engine
tests run on ``WorkflowEnvironment``'s fake clock (``env.advance`` fires due deadlines and start
clocks as beat's scan would; ``_beat`` adds the recovery scan beat also runs)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, WorkflowCancelledError, WorkflowTimedOutError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.schema import EXEC_ID
from celery_durable.errors import ConfigurationError
from celery_durable.testing.env import WorkflowEnvironment

pytestmark = pytest.mark.adversarial

app = Celery("deadline-breaks", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")

#: what the activities of a test did, in order
LOG: list[str] = []


# Breaks left open at stop 37 (docs/limitations.md, the closing note): each stays a strict xfail,
# so its fix shows as an XPASS that fails the run until the marker goes.
OPEN_CAUGHT_THEN_CONTINUED = (
    "open: as a cancel, a timeout the code caught is delivered again in the run it continued as new"
)
OPEN_TIMED_OUT_CHILDREN = (
    "open: an operator's re-run of a parent does not reopen a child that ended timed_out with the parent's "
    "deadline, nor lift the deadline a running child inherited"
)
OPEN_ONE_DELIVERY = (
    "open: a deadline is a cancel and is delivered once: after a caught cancel no deadline is delivered, after "
    "a caught timeout no cancel (delivering it there cut a cancelled saga's compensations: the simulation caught it)"
)
OPEN_DRIVEN_IN_BEAT = "open: beat's scan drives a timed-out execution inline, its local activities included"


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    LOG.clear()
    yield


def _env() -> WorkflowEnvironment:
    return WorkflowEnvironment(durable, start=1_000_000.0)


def _ex(env: WorkflowEnvironment, eid: str) -> dict[str, Any]:
    doc = env.store.read(eid, EXEC_ID)
    assert doc is not None
    return doc


def _beat(env: WorkflowEnvironment, seconds: float, rounds: int = 1) -> None:
    """``rounds`` times: time passes by ``seconds``, beat's clock scan and recovery scan run."""
    for _ in range(rounds):
        env.advance(seconds)
        env.engine.recovery.scan()
        env.run_until_idle()


def _children(env: WorkflowEnvironment, parent_id: str) -> list[str]:
    return [pk for pk in env.store.scan_partitions("", 100) if pk != parent_id]


@durable_activity(name="dlb.refund")
def refund(what: str) -> str:
    LOG.append(f"refund {what}")
    return f"refunded {what}"


# --- a compensation that is a child workflow ------------------------------------------------------


@durable.workflow(name="dlb.refund_flow")
def refund_flow(what: str) -> str:
    wf.sleep(5)  # a compensation that waits (a child workflow is a durable step like an activity)
    return refund(what)


@durable.workflow(name="dlb.compensated_by_child")
def compensated_by_child() -> str:
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        refund_flow.options().start_child("order-1").result()  # the compensation
        raise
    return "slept"


def test_a_compensation_child_started_after_the_deadline_is_not_timed_out_at_once() -> None:
    """Promise (guides/deadlines.md "Deadlines"): at the deadline the workflow's ``except``/Saga
    compensations run — "their activities are durable steps, run after the deadline" — and
    "compensations are never cut short by it"; the execution ends ``timed_out``.

    Observed: a compensation that starts a child workflow (a durable step like an activity) gets
    as its deadline the parent's, which has already passed: the child is timed out at the next
    clock scan before its code finished, the refund never runs, and the parent ends ``failed``
    (``ChildWorkflowError``) instead of ``timed_out``. Expected: the child runs to its end
    (``refund order-1``), the parent ends ``timed_out``.

    Cause: engine/replay/context.py:556 caps every new child's deadline with the execution's
    ``deadline_at`` even once that deadline was delivered (``timed_out``): the child is born with a
    deadline in the past (engine/starts/deadlines.py:122 ``exec_fields`` takes it as is)."""
    env = _env()
    h = env.start(compensated_by_child.options(timeout=60))
    env.advance(60)  # the deadline: the except starts the compensation child
    _beat(env, 10, rounds=3)  # its 5 s sleep, and a few scans more
    (child,) = _children(env, h.id)
    assert _ex(env, child)["status"] == "completed", _ex(env, child).get("error")
    assert LOG == ["refund order-1"]
    assert h.status() == "timed_out"


# --- catching the timeout and continuing as new ------------------------------------------------


@durable.workflow(name="dlb.catch_and_continue")
def catch_and_continue(n: int) -> str:
    if n == 0:
        wf.sleep(10)
        return "second run done"
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        wf.continue_as_new(0)  # the code goes on: a fresh run
    return "not reached"


@pytest.mark.xfail(strict=True, reason=OPEN_CAUGHT_THEN_CONTINUED)
def test_a_caught_timeout_is_delivered_once_not_again_in_the_next_run() -> None:
    """Promise (guides/deadlines.md): "Code that catches it and goes on ends as its code decides
    (a deadline is delivered once, as a cancel is)".

    Observed: a workflow that catches ``WorkflowTimedOutError`` and goes on with
    ``wf.continue_as_new(0)`` gets the timeout again at the first suspension of the new run
    (its ``wf.sleep(10)``) and ends ``timed_out``. Expected: the new run sleeps 10 s and
    completes with ``"second run done"``.

    Cause: engine/drive/driver.py:463 (``ReplayKind.CONTINUED``) starts the new run from the old
    exec document, keeping ``cancel_requested=True`` and ``timed_out=True`` (set at
    driver.py:196): the replay of the new run raises the delivered cancel again at its first
    suspension point (engine/replay/context.py:278)."""
    env = _env()
    h = env.start(catch_and_continue.options(timeout=60), 1)
    env.advance(60)
    env.advance(20)
    ex = _ex(env, h.id)
    assert ex["run"] == 1
    assert ex["status"] == "completed", ex.get("error", {}).get("message")
    assert h.result(timeout=0) == "second run done"


# --- resume of a timed-out parent whose child inherited its deadline ----------------------------


@durable.workflow(name="dlb.kid")
def kid() -> str:
    wf.sleep(1000)
    return "kid done"


@durable.workflow(name="dlb.parent")
def parent() -> str:
    return kid.options().start_child().result()  # no own timeout: it gets the parent's


@pytest.mark.xfail(strict=True, reason=OPEN_TIMED_OUT_CHILDREN)
def test_resume_of_a_timed_out_parent_runs_its_interrupted_child_step_again() -> None:
    """Promise (guides/deadlines.md "Operators"): ``resume`` applies to a timed-out execution as to
    a cancelled one — "the timeout's outcomes and the compensations after it are forgotten, the
    interrupted steps run again" — and "a re-run by an operator has no deadline: kept, it would
    end again at once". A child started with no timeout "gets the parent's" deadline.

    Observed: the parent (timeout 60 s) waits on a child with no timeout of its own; at the
    deadline the child is cancelled by its parent (``cancelled_by_parent: True``) and ends
    ``timed_out`` too. After ``Admin.resume(parent)`` the parent's child step is not run again:
    the child stays ``timed_out`` and the resumed parent ends ``failed`` (``ChildWorkflowError:
    ... WorkflowTimedOutError``) once the recovery scan looks at the step — the lifted deadline
    ends the re-run all the same. (With a cancelled parent the same child is resumed.)
    Expected: the child is reopened with its parent's step (without the lifted deadline) and the
    parent completes with ``"kid done"``.

    Cause: engine/admin/cancel_withdrawal.py:52 ``ended_by_parent`` requires status
    ``cancelled``; a child ended ``timed_out`` by the parent's deadline (inherited at
    engine/replay/context.py:556) is neither reopened by ``_rearm`` (engine/admin/operator.py:540)
    nor by ``withdrawn_cancels`` (engine/children/holders.py:93 marks ``cancelled_by_parent`` only
    for status ``cancelled``)."""
    env = _env()
    h = env.start(parent.options(timeout=60))
    (child,) = _children(env, h.id)
    env.advance(60)
    assert h.status() == "timed_out"
    assert _ex(env, child).get("cancelled_by_parent") is True  # its parent's cancel ended it
    Admin(env.engine).resume(h.id)
    env.run_until_idle()
    _beat(env, 600, rounds=4)  # the child's 1000 s sleep, and recovery's child scans
    assert _ex(env, h.id)["status"] == "completed", _ex(env, h.id).get("error", {}).get("message")
    assert h.result(timeout=0) == "kid done"


# --- a deadline after a cancel the code caught, a cancel after a timeout it caught ------------------


@durable.workflow(name="dlb.goes_on")
def goes_on() -> str:
    try:
        wf.sleep(3600)
    except WorkflowCancelledError as exc:  # a cancel (or a timeout: it is one) caught: the code goes on
        LOG.append(f"caught {type(exc).__name__}")
    wf.sleep(10_000)
    return "went on"


@pytest.mark.xfail(strict=True, reason=OPEN_ONE_DELIVERY)
def test_a_deadline_is_enforced_after_the_code_caught_an_earlier_cancel() -> None:
    """Promise (guides/deadlines.md): at the deadline the workflow raises ``WorkflowTimedOutError``
    at its suspension point and ends ``timed_out``; it is "enforced durably ... within one scan
    interval" — nothing can skip it.

    Observed: the workflow (timeout 60 s) catches an operator's cancel at t=10 and goes on to a
    ``wf.sleep(10_000)``; at t=60 the deadline's clock fires and marks the exec
    ``timed_out: True`` but nothing is delivered: the workflow sleeps on 10 000 s past its
    deadline and ends ``completed`` ("went on"). Expected: ``WorkflowTimedOutError`` at the sleep,
    status ``timed_out`` right after t=60.

    Cause: the timing-out drive only sets ``cancel_requested``/``timed_out`` on the exec
    (engine/drive/driver.py:196-197); the replay delivers a cancel only when none was delivered yet
    (engine/replay/context.py:258), and replaying the earlier cancel's outcome sets
    ``cancel_delivered`` (context.py:319): the deadline is swallowed, and the clock is settled as
    fired (engine/starts/deadlines.py:171-178 sees ``timed_out``)."""
    env = _env()
    h = env.start(goes_on.options(timeout=60))
    env.advance(10)
    assert env.cancel(h) is True
    env.run_until_idle()
    assert LOG == ["caught WorkflowCancelledError"] and h.status() == "running"
    env.advance(50)  # the deadline
    env.advance(1)
    assert h.status() == "timed_out"
    with pytest.raises(WorkflowTimedOutError):
        h.result(timeout=0)


@pytest.mark.xfail(strict=True, reason=OPEN_ONE_DELIVERY)
def test_a_cancel_after_a_caught_timeout_is_delivered() -> None:
    """Promise (guides/deadlines.md): "Code that catches it and goes on ends as its code decides";
    ``handle.cancel()`` persists a cancel request and wakes the execution (engine/core.py
    ``Engine.cancel``), raising ``WorkflowCancelledError`` at its suspension point.

    Observed: the workflow catches its timeout at t=60 and goes on to a ``wf.sleep(10_000)``;
    ``h.cancel()`` then returns ``True`` but is never delivered: the workflow sleeps on and ends
    ``completed``. Once a deadline was caught, the execution cannot be cancelled any more (only
    terminated). Expected: the cancel raises at the sleep and the execution ends ``cancelled``.

    Cause: the deadline is recorded as a cancel request (engine/drive/driver.py:197
    ``cancel_requested=True``); ``Engine.cancel`` returns True without recording anything for a
    client cancel when ``cancel_requested`` is already set (engine/core.py:322), and the replay
    delivers a cancel only once (engine/replay/context.py:258, ``cancel_delivered`` set by the
    timeout's outcome at context.py:319)."""
    env = _env()
    h = env.start(goes_on.options(timeout=60))
    env.advance(60)
    assert LOG == ["caught WorkflowTimedOutError"] and h.status() == "running"
    assert h.cancel() is True
    env.run_until_idle()
    env.advance(1)
    assert h.status() == "cancelled"


# --- a delayed start driven late -------------------------------------------------------------------


@durable.workflow(name="dlb.waiter", signals={"go": str})
def waiter() -> str:
    LOG.append("waiter ran")
    return str(wf.wait_signal("go"))


def test_a_delayed_starts_timeout_counts_from_its_first_drive() -> None:
    """Promise (guides/deadlines.md): "The timeout counts from the execution's first drive: with
    ``start_delay``, from the end of the delay" (engine/starts/deadlines.py docstring: "A timeout
    counts from the start of the first drive").

    Observed: ``start_delay=10, timeout=5``; beat's scan runs late (at t=100: beat was down, or
    the store unreachable): the start clock and the deadline fire in the same scan, the first
    drive happens at t=100 and the execution is timed out in the same scan — it got 0 s of its 5 s.
    Its ``deadline_at`` is the planned ``start + 10 + 5`` (1 000 015), not its first drive + 5.
    Expected: the deadline counts from the first drive (t=100): still ``running`` right after it,
    ``timed_out`` at t=105.

    Cause: engine/starts/deadlines.py:114-122 ``exec_fields`` fixes ``deadline_at`` at creation
    from the planned start (``now + delay``); ``_fire_start`` (deadlines.py:209-228) does not move
    it (nor the deadline clock) to the actual start."""
    env = _env()
    h = env.start(waiter.options(start_delay=10, timeout=5))
    env.advance(100)  # one late scan
    assert LOG == ["waiter ran"]
    assert h.status() == "running"
    assert _ex(env, h.id)["deadline_at"] == 1_000_105.0


# --- retry of a parent failed by its child's timeout ----------------------------------------------


@durable.workflow(name="dlb.slow_kid")
def slow_kid() -> str:
    wf.sleep(100)
    return "kid done"


@durable.workflow(name="dlb.impatient_parent")
def impatient_parent() -> str:
    return slow_kid.options(timeout=20).start_child().result()


@pytest.mark.xfail(strict=True, reason=OPEN_TIMED_OUT_CHILDREN)
def test_retry_of_a_parent_failed_by_its_childs_timeout_runs_the_child_again() -> None:
    """Promise (guides/deadlines.md): "A child that times out is a ``ChildWorkflowError`` (type
    ``WorkflowTimedOutError``) in the parent, like any child failure", and "A re-run by an operator
    — retry, resume, reset — has no deadline"; ``Admin.retry`` (engine/admin/operator.py
    ``retry``): the failed step "loses its result (... a failed child is retried itself)".

    Observed: the child (own timeout 20 s) times out, the parent ends ``failed``
    (``ChildWorkflowError``). ``Admin.retry(parent)`` reports step 1 (the child) as re-run, the
    parent is ``running`` again, but the child is not reopened: it stays ``timed_out`` and the
    parent fails again with the very same error at the next recovery scan — the retry can never
    succeed. Expected: the child is retried with its step (its deadline lifted, as for any re-run),
    sleeps its 100 s and the parent completes with ``"kid done"``.

    Cause: engine/admin/operator.py:540 reopens a child step's child only when it is ``failed``
    or ``ended_by_parent`` (status ``cancelled``, engine/admin/cancel_withdrawal.py:52): a
    ``timed_out`` child is left as it is and the child scan hands its old end to the step again."""
    env = _env()
    h = env.start(impatient_parent)
    env.advance(20)
    (child,) = _children(env, h.id)
    assert _ex(env, child)["status"] == "timed_out" and h.status() == "failed"
    rerun = Admin(env.engine).retry(h.id)
    assert [s.seq for s in rerun] == [1]
    env.run_until_idle()
    _beat(env, 600, rounds=3)  # the child's 100 s sleep, and recovery's child scans
    assert _ex(env, h.id)["status"] == "completed", _ex(env, h.id).get("error", {}).get("message")
    assert h.result(timeout=0) == "kid done"


# --- bad inputs ----------------------------------------------------------------------------------


@durable.workflow(name="dlb.quick")
def quick() -> str:
    return "ok"


@pytest.mark.parametrize(
    ("option", "value"),
    [("timeout", 10**400), ("start_delay", 10**400), ("timeout", -(10**400))],
    ids=["timeout-huge", "start_delay-huge", "timeout-huge-negative"],
)
def test_an_int_too_large_for_a_float_is_a_configuration_error(option: str, value: int) -> None:
    """Promise (guides/deadlines.md): ``timeout`` and ``start_delay`` "are checked in the caller
    before anything is stored" and a bad value raises ``ConfigurationError`` (negative; more than
    100 years: engine/starts/deadlines.py ``check_seconds`` "must be at most ...").

    Observed: an ``int`` too large for a float (``10**400``, or ``-10**400``) escapes as a bare
    ``OverflowError: int too large to convert to float`` from ``options()``. Expected:
    ``ConfigurationError`` (too long / negative), like ``2**53 + 1`` or ``timedelta.max`` get.

    Cause: engine/starts/deadlines.py:84 ``seconds = float(value)`` for any ``int`` before the
    bounds are checked."""
    env = _env()
    with pytest.raises(ConfigurationError):
        env.start(quick.options(workflow_id="never", **{option: value}))
    assert env.store.read("never", EXEC_ID) is None


# --- the deadline fired by a process that does not have the workflow's code -----------------------


def test_a_deadline_fired_where_the_workflow_is_not_registered_still_ends_it_timed_out() -> None:
    """Promise (guides/deadlines.md "Enforced durably"): "The scan drives the execution itself:
    the commit that marks it ``timed_out`` records the timeout at its suspension point, all or
    nothing"; a signal after the deadline is refused (the execution ended ``timed_out``).

    Observed: beat's scan fires the deadline in a process where the workflow is not registered (a
    rolling deploy: the driver's "not registered in this worker; it will be retried" path). That
    drive commits ``timed_out: True, cancel_requested: True`` on the exec *without* recording
    the timeout as the signal wait's outcome, and the clock is settled as fired. A signal sent
    after the deadline is then accepted (``True``) and the worker's drive consumes it: the
    execution ends ``completed`` with the late value, after its deadline.
    Expected: the mark and the timeout's outcome in one commit (or neither, the clock staying
    due): the execution ends ``timed_out`` and the late signal is refused.

    Cause: engine/drive/driver.py:196-197 marks the exec before the replay; the
    ``ReplayKind.UNKNOWN`` branch (driver.py:454-462) commits that exec with no outcome; then
    engine/starts/deadlines.py:174-178 finds ``timed_out`` and settles the clock."""
    from unittest import mock

    env = _env()
    h = env.start(waiter.options(timeout=60))
    registry = env.engine.registry
    known = registry.workflow
    env.clock.t += 60
    with mock.patch.object(registry, "workflow", lambda name: None if name == "dlb.waiter" else known(name)):
        env.engine.timers.fire_due_clocks()  # beat, one deploy behind the workers
    env.signal(h, "go", "late")
    env.run_until_idle()
    _beat(env, 600)
    assert h.status() == "timed_out", _ex(env, h.id).get("result")


def test_a_deadline_fired_while_a_worker_drives_still_refuses_a_later_signal() -> None:
    """Promise (guides/deadlines.md "Enforced durably"): "the commit that marks it ``timed_out``
    records the timeout at its suspension point, all or nothing" (docs/architecture.md: "the very
    commit that sets ``cancel_requested`` and ``timed_out`` on the exec records the timeout ... as
    the outcome of the steps it waits on"); a signal after the deadline does not complete it.

    Observed: the deadline comes due while a worker holds the exec's drive lease (a drive in
    flight). Beat's timing-out drive defers to it, but its "bump" commits the exec with
    ``timed_out: True, cancel_requested: True`` and no outcome; ``_fire_deadline`` then sees the
    mark and settles the clock (``fire_due_clocks`` counts it fired). A signal sent after the
    deadline, before the next drive, is accepted and consumed by that drive: the execution ends
    ``completed`` with the late value. Expected: ``timed_out`` (the signal wait's outcome is the
    timeout), or the clock left due until the timeout is recorded.

    Cause: engine/drive/driver.py:196-197 puts the marks on ``ex`` before ``_contend``;
    driver.py:311 ``_record_bumped`` commits that exec (marks included) without replaying; then
    engine/starts/deadlines.py:174-178 takes ``timed_out`` on the exec for "recorded" and settles."""
    from celery_durable.stores.base import strip_reserved

    env = _env()
    h = env.start(waiter.options(timeout=60))
    env.clock.t += 60
    doc = env.store.read(h.id, EXEC_ID)
    assert doc is not None  # another worker's drive holds the lease for 30 s more
    busy = strip_reserved(doc) | {"lease": {"holder": "other-worker", "expires": env.clock.t + 30}}
    env.store.replace(busy, if_match=doc["_etag"])
    env.engine.timers.fire_due_clocks()  # beat's scan at the deadline
    env.signal(h, "go", "late")
    env.run_until_idle()
    env.clock.t += 31  # the holder is gone: recovery drives it
    env.engine.recovery.scan()
    env.run_until_idle()
    env.advance(1)
    assert h.status() == "timed_out", _ex(env, h.id).get("result")


# --- an operator's re-run of a parent whose running child inherited its deadline -------------------

FLAKY = {"failures": 0}


@durable_activity(name="dlb.flaky")
def flaky() -> str:
    if FLAKY["failures"] > 0:
        FLAKY["failures"] -= 1
        raise ValueError("boom")
    return "fine"


@durable.workflow(name="dlb.parent_with_a_running_child")
def parent_with_a_running_child() -> str:
    pending = kid.options().start_child()  # no timeout of its own: it gets the parent's
    flaky()
    return pending.result()


@pytest.mark.xfail(strict=True, reason=OPEN_TIMED_OUT_CHILDREN)
def test_a_retried_parent_has_no_deadline_even_through_the_child_it_waits_for() -> None:
    """Promise (guides/deadlines.md "Operators"): "A re-run by an operator — retry, resume, reset —
    **has no deadline**: kept, it would end again at once"; a child started with no timeout "gets
    the parent's" deadline.

    Observed: the parent (timeout 600 s) starts a child with no timeout of its own (it inherits the
    parent's 600 s), then fails at once on an activity. ``Admin.retry(parent)`` lifts the parent's
    ``deadline_at``, the activity succeeds and the re-run waits for the child, which is still
    running — but still with the parent's old deadline: at t=600 the child is timed out and the
    re-run ends ``failed`` (``ChildWorkflowError: ... WorkflowTimedOutError``): the lifted deadline
    ended the re-run all the same. Expected: the child (which never had a deadline of its own)
    finishes its 1000 s sleep and the parent completes with ``"kid done"``.

    Cause: the lift (``LIFTED``, engine/admin/operator.py:349) clears the re-run execution's
    ``deadline_at`` only; the inherited copy on its running child's exec and the child's
    ``clock:deadline`` (written at its creation, engine/starts/deadlines.py:114-123, from the cap
    at engine/replay/context.py:556) are left due."""
    FLAKY["failures"] = 1
    env = _env()
    h = env.start(parent_with_a_running_child.options(timeout=600))
    env.run_until_idle()
    (child,) = _children(env, h.id)
    assert h.status() == "failed" and _ex(env, child)["status"] == "running"
    assert [s.seq for s in Admin(env.engine).retry(h.id)] == [2]
    env.run_until_idle()
    assert h.status() == "running" and _ex(env, h.id).get("deadline_at") is None
    _beat(env, 300, rounds=5)  # t = 1500: past the old deadline and the child's 1000 s sleep
    assert _ex(env, h.id)["status"] == "completed", _ex(env, h.id).get("error", {}).get("message")
    assert h.result(timeout=0) == "kid done"


# --- one execution's compensation delays every other deadline ------------------------------------

ENV: dict[str, WorkflowEnvironment] = {}


@durable_activity(name="dlb.slow_local_undo", local=True)
def slow_local_undo(what: str) -> str:
    ENV["env"].clock.t += 30  # a compensation that takes 30 s (run inside the drive: local=True)
    LOG.append(f"undo {what}")
    return what


@durable.workflow(name="dlb.compensated_locally")
def compensated_locally() -> str:
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        slow_local_undo("a")
        raise
    return "slept"


@pytest.mark.xfail(strict=True, reason=OPEN_DRIVEN_IN_BEAT)
def test_a_deadline_is_enforced_within_one_scan_interval_whatever_other_compensations_do() -> None:
    """Promise (guides/deadlines.md "Enforced durably"; limitations.md): a deadline "is enforced
    within one scan interval" (``durable_clock_interval``, 1 s by default); beat's scans "read the
    store directly and send only what they find: the drives, timers and re-sends that are due"
    (glue/beat_scans.py).

    Observed: executions A (deadline t=59) and B (deadline t=60) are both due at beat's scan at
    t=60. Firing A's deadline drives A *in the scan's thread*: the replay goes on past the raised
    ``WorkflowTimedOutError`` into A's compensation, a local activity that takes 30 s, run right
    there. B's deadline is fired only after it: B ends ``timed_out`` 30 s after its deadline
    (``completed_at - deadline_at == 30``), not within the 1 s interval; every timer and start
    clock due in that scan waits likewise, and user workflow code runs inside beat.
    Expected: B timed out within one scan interval of its deadline.

    Cause: engine/starts/deadlines.py:174 ``eng.driver.drive(pk, timing_out=True)`` runs the whole
    drive (replay, compensations, local activities: engine/activities/local_activities.py) inline,
    and engine/timers/clocks.py:101-120 ``fire_due_clocks`` fires the due clocks one after another."""
    env = _env()
    ENV["env"] = env
    a = env.start(compensated_locally.options(timeout=59))
    b = env.start(waiter.options(timeout=60))
    env.advance(60)  # one scan: both deadlines are due
    assert _ex(env, a.id)["status"] == "timed_out" and "undo a" in LOG
    ended = _ex(env, b.id)
    assert ended["status"] == "timed_out"
    assert ended["completed_at"] - ended["deadline_at"] <= env.engine.settings.clock_interval


# --- real workers ----------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from tests.integration.conftest import cluster  # noqa: E402, F401 - the worker tests' fixture
from tests.plugins.workers import wait_until  # noqa: E402

DL_APP = "tests.apps.dl_breaker"
FAST = {"TEST_CLOCK_INTERVAL": "0.5"}


@pytest.mark.worker
def test_workers_a_compensation_child_runs_after_the_deadline(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    """Worker version of ``test_a_compensation_child_started_after_the_deadline_is_not_timed_out_
    at_once``, on ``celery worker`` and ``celery beat`` processes: at the 2 s deadline the
    workflow's ``except`` starts its compensation, a child workflow that sleeps 3 s then refunds.

    Observed: the child is born with its parent's deadline, already passed: beat's next clock
    scan (0.5 s) times it out in its sleep, the refund never runs and the parent ends ``failed``
    (``ChildWorkflowError``). Expected (guides/deadlines.md: compensations "run after the
    deadline", "are never cut short by it"): the refund runs once and the parent ends
    ``timed_out``. Cause: engine/replay/context.py:556 (see the engine test)."""
    from tests.apps import dl_breaker

    marks = tmp_path / "marks"
    cluster.workers.env.update(FAST)
    with cluster.client_of(dl_breaker, marks):
        cluster.start_worker(app=DL_APP, concurrency=2)
        cluster.workers.start_beat(app=DL_APP)
        handle = dl_breaker.order.options(timeout=2.0).start("o1")
        store = dl_breaker.durable.engine.store
        wait_until(
            lambda: (store.read(handle.id, "exec") or {}).get("status") not in ("running", None),
            timeout=60,
            what="the order to end",
        )
        ended = store.read(handle.id, "exec") or {}
        assert ended.get("status") == "timed_out", (ended.get("error") or {}).get("message")
        assert (marks / "refunded-o1").exists(), "the compensation child never refunded"
        with pytest.raises(WorkflowTimedOutError):
            handle.result(timeout=5)
