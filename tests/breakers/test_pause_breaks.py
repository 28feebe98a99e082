"""Attacks on pausing an execution (``durable pause|unpause``, ``Durable.pause/unpause``;
celery_durable/engine/admin/pause.py, the ``paused`` branch of ``Driver._round``).

The promises (engine/admin/pause.py, docs/operating/cli.md): a paused execution is not replayed —
what arrives meanwhile is recorded, no new step is taken and no new work is sent; beat sends it
nothing; its status stays what it was (running, queued, scheduled); unpause drives it and it goes
on from everything recorded (a deadline that passed meanwhile is delivered then); terminate works
on a paused execution; pause/unpause are recorded operations (who, why) like a cancel.

Tests under "breaks" failed on the code they were written against (83c7233); those under "held"
document attacks that did not break it. They run on ``tests/engine/inprocess.py``'s ``InProcess``
(a fake clock, an inline dispatcher) or on ``WorkflowEnvironment``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, Limit, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine import Engine, InlineDispatcher
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.admin.timeline import summary_of
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.starts.deadlines import Timing
from celery_durable.errors import DurableError, OperationRefused
from celery_durable.testing.env import WorkflowEnvironment
from tests.engine.inprocess import InProcess

pytestmark = pytest.mark.adversarial

app = Celery("pause-breaks", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")

RAN: list[str] = []
FLAKY_CALLS: list[int] = []


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    RAN.clear()
    FLAKY_CALLS.clear()
    yield


def _world() -> tuple[InProcess, Any]:
    """``job``: activity one, sleep 60 s, activity two."""
    w = InProcess()

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        return name

    def job() -> list[str]:
        out = [step("one")]
        wf.sleep(60)
        out.append(step("two"))
        return out

    return w, w.registry.add_workflow("job", job)


def _beat(w: InProcess, seconds: float, rounds: int) -> None:
    for _ in range(rounds):
        w.clock.advance(seconds)  # type: ignore[attr-defined]
        w.engine.timers.fire_due_clocks()
        w.engine.recovery.scan()
        w.run()


def _run_holding_activities(w: InProcess, held: list[Any]) -> None:
    """Run queued drives (and what they queue) but keep activity messages back in ``held``."""
    q = w.dispatcher.queue
    while q:
        kind, item = q.popleft()
        if kind == "activity":
            held.append(item)
            continue
        q.appendleft((kind, item))
        w.dispatcher.run_some(1)


def _no_spin(env: WorkflowEnvironment, most: int = 100) -> list[int]:
    """Make ``env.skip_to_next_timer`` raise after ``most`` calls (a loop that never moves on)."""
    calls = [0]
    skip = env.skip_to_next_timer

    def counted() -> bool:
        calls[0] += 1
        if calls[0] > most:
            raise AssertionError(f"skip_to_next_timer called {most} times at t={env.clock.t}: it spins")
        return skip()

    env.skip_to_next_timer = counted  # type: ignore[method-assign]
    return calls


@durable.workflow(name="pzb.sleeper")
def sleeper() -> str:
    wf.sleep(3600)
    return "done"


@durable_activity(name="pzb.flaky", local=True, autoretry_for=(RuntimeError,), max_retries=3, default_retry_delay=600)
def flaky() -> str:
    FLAKY_CALLS.append(1)
    if len(FLAKY_CALLS) < 2:
        raise RuntimeError("first attempt fails")
    return "ok"


@durable.workflow(name="pzb.local_retry")
def local_retry() -> str:
    return str(flaky())


# --- breaks -------------------------------------------------------------------------------------


def test_paused_deadline_clock_is_not_fired_again_at_every_scan() -> None:
    """A deadline that passes while paused is fired once (recorded, delivered at the unpause).
    Observed: ``_fire_deadline`` drives with ``timing_out``, the paused branch of ``Driver._round``
    returns before the mark, so the clock stays due and every clock scan fires it again (an event
    ``workflow_deadline`` and a drive per scan for as long as it is paused)."""
    w, d = _world()
    events: list[str] = []
    w.engine.subscribe(lambda event, **_: events.append(event))
    w.engine.start(d, (), {}, workflow_id="dl", timing=Timing(timeout=30))
    w.run()
    assert pause(w.engine, "dl", "ops")
    _beat(w, 31, rounds=10)
    assert events.count("workflow_deadline") <= 1, f"fired {events.count('workflow_deadline')} times while paused"
    unpause(w.engine, "dl", "ops")
    w.run()
    assert w.status("dl") == "timed_out"


def test_env_result_of_a_paused_execution_past_its_deadline_does_not_spin() -> None:
    """``WorkflowEnvironment.result`` of a paused execution raises (nothing will end it) rather than
    loop. Observed: its deadline clock stays due in the past (see the test above), so
    ``skip_to_next_timer`` jumps to the same time forever: the clock never passes ``max_time``."""
    env = WorkflowEnvironment(durable, start=1_000_000.0)
    h = env.start(sleeper.options(timeout=60))
    pause(env.engine, h.id, "ops")
    _no_spin(env)
    with pytest.raises(DurableError, match="still running"):
        env.result(h, max_time=timedelta(days=1))


def test_env_result_of_a_paused_local_activity_retry_does_not_spin() -> None:
    """The same with a local activity's retry timer: ``Timers._fire_local_retry`` drives, the paused
    drive does nothing and the marker stays due at its ``fire_at``: fired at every scan, and
    ``WorkflowEnvironment.result`` loops at that time forever."""
    env = WorkflowEnvironment(durable, start=1_000_000.0)
    h = env.start(local_retry)
    assert h.status() == "running" and len(FLAKY_CALLS) == 1  # its retry timer is 600 s away
    pause(env.engine, h.id, "ops")
    _no_spin(env)
    with pytest.raises(DurableError, match="still running"):
        env.result(h, max_time=timedelta(days=1))
    unpause(env.engine, h.id, "ops")
    env.run_until_idle()
    assert h.status() == "completed"


def test_paused_childs_deadline_that_passed_is_delivered_at_unpause_not_a_new_step() -> None:
    """A child paused past its own deadline gets the timeout at its unpause, and nothing of it runs
    after (its activity's late result ignored), as without the pause. Observed: the clock's ``timing_out``
    drive left nothing (paused branch), and the unpause's drive of a child does not deliver a
    passed deadline (``Driver._round``: ``timing_out = d.timing_out or not ex.get("parent")``):
    the child takes a new step and sends activity k2 past its deadline, timed out only at the
    next clock scan."""
    w = InProcess()

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        return name

    def kid() -> str:
        return str(step("k1")) + str(step("k2"))

    kd = w.workflow(kid)

    def par() -> str:
        return str(require_context("parent").start_child(kd, (), {}, "kid-1", 60).result())

    pd = w.workflow(par)
    held: list[Any] = []
    w.engine.start(pd, (), {}, workflow_id="par")
    _run_holding_activities(w, held)
    (req,) = held
    held.clear()
    attempt, _ = w.engine.activities.begin(req.execution_id, req.seq, req.run)
    assert attempt is not None
    pause(w.engine, "kid-1", "ops")
    w.clock.advance(120)  # type: ignore[attr-defined]
    w.engine.timers.fire_due_clocks()  # its deadline's clock
    _run_holding_activities(w, held)
    w.engine.activities.complete(attempt, w.engine.activities.result_doc(attempt, value="k1"))
    _run_holding_activities(w, held)
    assert not held
    unpause(w.engine, "kid-1", "ops")
    assert w.status("kid-1") == "timed_out"  # at the unpause, not at the next clock scan
    _run_holding_activities(w, held)
    # the timing-out replay may send the step it reached before its suspension point (as without a
    # pause: the timeout is delivered there); that message never runs: its execution has ended
    for r in held:
        attempt, why = w.engine.activities.begin(r.execution_id, r.seq, r.run)
        assert attempt is None and "timed_out" in why


def test_a_paused_parents_deadline_is_its_capped_childs_and_comes_with_the_unpause() -> None:
    """A child whose deadline is its parent's (capped by it) times out with its parent — the parent
    first, so it ends ``timed_out`` and its child is cancelled (not failed by its child's timeout:
    the simulation's seed 747). While the parent is paused its deadline waits for the unpause, and
    so does the capped child's (it runs on): the child's clock is looked at a recovery interval
    apart, not at every clock scan. Found by this breaker as a child clock EARLY at every scan
    (now snoozed); its first fix (the child timing out alone while its parent was paused) failed
    the parent with ChildWorkflowError at the unpause."""
    w = InProcess()

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        return name

    def kid() -> str:
        for i in range(40):  # longer than the pause below
            step(f"k{i}")
            wf.sleep(50)
        return "kid"

    kd = w.workflow(kid)

    def par() -> str:
        return str(require_context("parent").start_child(kd, (), {}, "kid-1").result())

    pd = w.workflow(par)
    w.engine.start(pd, (), {}, workflow_id="par", timing=Timing(timeout=120))
    w.run()
    pause(w.engine, "par", "ops")
    writes: list[str] = []
    real = w.store.replace

    def counting(doc: Any, if_match: Any = None) -> Any:
        writes.append(str(doc.get("id")))
        return real(doc, if_match=if_match)

    w.store.replace = counting  # type: ignore[method-assign]
    _beat(w, 51, rounds=12)
    w.store.replace = real  # type: ignore[method-assign]
    assert writes.count("clock:deadline") <= 12 * 51 / w.engine.settings.recovery_interval + 2
    unpause(w.engine, "par", "ops")
    _beat(w, 5, rounds=3)
    assert w.status("par") == "timed_out"
    assert w.status("kid-1") == "cancelled"


def test_paused_scheduled_execution_stays_scheduled_when_its_start_time_passes() -> None:
    """Status stays what it was: a paused ``scheduled`` execution stays scheduled (none of its code
    may run) until unpaused. Observed: ``deadlines._fire_start`` ignores ``paused`` and makes it
    ``running`` (its timeout counting from then)."""
    w, d = _world()
    w.engine.start(d, (), {}, workflow_id="sch", timing=Timing(start_delay=10))
    w.run()
    assert w.status("sch") == "scheduled"
    pause(w.engine, "sch", "ops")
    _beat(w, 20, rounds=2)
    assert w.status("sch") == "scheduled"
    unpause(w.engine, "sch", "ops")
    _beat(w, 20, rounds=1)
    assert RAN == ["one"]


def test_paused_queued_execution_is_not_given_the_slot_over_an_unpaused_one() -> None:
    """A paused ``queued`` execution stays queued; a freed slot goes to the next one that can run.
    Observed: the grant (``limits.workflows.begin_queued``) ignores ``paused``: the paused one
    becomes ``running`` and holds the only slot doing nothing, the next one waits behind it."""
    w = InProcess()

    def tenant_job(n: str) -> str:
        return f"{n}:{wf.wait_signal('go')}"

    d = w.registry.add_workflow("tenant_job", tenant_job, None, Limit("pzb-lim", max_running=1))
    for eid in "ABC":
        w.engine.start(d, (eid,), {}, workflow_id=eid)
        w.run()
    assert [w.status(e) for e in "ABC"] == ["running", "queued", "queued"]
    pause(w.engine, "B", "ops")
    w.engine.signal("A", "go", 1)
    w.run()
    _beat(w, 60, rounds=3)
    assert [w.status(e) for e in "ABC"] == ["completed", "queued", "running"]


def test_a_terminated_paused_execution_is_not_left_paused_and_its_retry_runs() -> None:
    """An ended execution is not paused (pause refuses one, unpause too): terminating a paused
    execution ends its pause, and a retry of it runs. Observed: ``terminate`` keeps ``paused``
    (``show`` says "paused since" on a failed execution), the retry's ``reopened`` fields
    (``Admin._operate``) keep it too: the retried execution is ``running`` and nothing of it runs,
    and unpause was refused while it was failed."""
    w, d = _world()
    w.engine.start(d, (), {}, workflow_id="t")
    w.run()
    pause(w.engine, "t", "ops")
    assert terminate(w.engine, "t", "ops", None)
    assert summary_of(w.ex("t")).paused_at is None, "a failed execution shown as paused"
    Admin(w.engine).retry("t")
    w.run()
    _beat(w, 61, rounds=2)
    assert w.status("t") == "completed" and RAN == ["one", "two"]


def test_recovery_does_not_resend_a_lost_activity_while_paused() -> None:
    """No new work is sent while paused. Observed: an attempt lost while paused (its worker killed)
    is sent again by beat's recovery scan (``Recovery._activity_due`` never looks at ``paused``):
    the activity's code runs again while the execution is paused."""
    w = InProcess()

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        return name

    def job() -> str:
        return str(step("one"))

    d = w.workflow(job)
    w.engine.start(d, (), {}, workflow_id="r")
    _, eid = w.dispatcher.queue.popleft()
    w.engine.drive(eid)
    ((_, req),) = list(w.dispatcher.queue)
    w.dispatcher.queue.clear()
    attempt, _ = w.engine.activities.begin(req.execution_id, req.seq, req.run)  # then its worker dies
    assert attempt is not None
    pause(w.engine, "r", "ops")
    sent = len(w.dispatcher.sent)
    _beat(w, 600, rounds=10)
    assert [kind for kind, _ in w.dispatcher.sent[sent:]] == [] and RAN == []
    unpause(w.engine, "r", "ops")
    _beat(w, 600, rounds=3)
    assert w.status("r") == "completed"


@pytest.mark.parametrize("reason", [123, {"why": "x"}, "x" * 5000])
def test_pause_refuses_a_reason_every_other_operation_refuses(reason: Any) -> None:
    """``reason`` is None or a string of at most 4096 characters, refused otherwise before anything
    is written (``pending_ops.check_field``, as terminate, cancel and ``oplog.note`` do). Observed:
    ``pause._set`` checks only ``by``: an int, a dict or a 5,000-character reason is stored in the
    operation document."""
    w, d = _world()
    w.engine.start(d, (), {}, workflow_id="why")
    w.run()
    with pytest.raises(OperationRefused, match="reason"):
        pause(w.engine, "why", "ops", reason)
    assert not w.ex("why").get("paused")


# --- held ---------------------------------------------------------------------------------------


def test_held_signal_after_a_fired_wait_timeout_and_a_lost_unpause_drive() -> None:
    """A signal wait's timeout fired while paused wins over a signal sent after it (as unpaused);
    nothing is written or sent over 20 scan intervals while paused; a lost unpause drive is
    recovered by beat (the unpause leaves it due)."""
    w = InProcess()

    def waits() -> Any:
        try:
            return wf.wait_signal("go", timeout=30)
        except Exception as exc:  # noqa: BLE001 - the wait's timeout
            return type(exc).__name__

    d = w.workflow(waits)
    w.engine.start(d, (), {}, workflow_id="s")
    w.run()
    pause(w.engine, "s", "ops")
    _beat(w, 31, rounds=1)
    w.engine.signal("s", "go", "late")
    w.run()
    writes: list[str] = []
    for name in ("batch", "replace", "create", "delete"):
        real = getattr(w.store, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            writes.append(_name)
            return _real(*args, **kwargs)

        setattr(w.store, name, spy)
    sent = len(w.dispatcher.sent)
    for _ in range(20):
        _beat(w, 300, rounds=1)
        w.engine.outbox.scan()
    assert writes == [] and w.dispatcher.sent[sent:] == []
    unpause(w.engine, "s", "ops")
    w.dispatcher.queue.clear()  # the unpause's drive is lost
    _beat(w, 3600, rounds=1)
    assert w.status("s") == "completed" and w.ex("s")["result"] == "DurableTimeoutError"


@pytest.mark.parametrize("eager", [False, True])
def test_held_pause_from_another_process_during_an_activity(eager: bool) -> None:
    """Paused from another process (its own caches) while an activity runs, eager or not: the
    activity's result is recorded and the next is not sent (the commit conflicts on the exec etag);
    unpaused, it completes."""
    w = InProcess()
    w.dispatcher.eager = eager
    other = Engine(w.store, InlineDispatcher(), w.registry, clock=w.clock)

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        if name == "a":
            pause(other, "e", "ops")
        return name

    def job() -> list[str]:
        return [step("a"), step("b"), step("c")]

    d = w.workflow(job)
    w.engine.start(d, (), {}, workflow_id="e")
    w.run()
    _beat(w, 3600, rounds=2)
    assert RAN == ["a"] and w.status("e") == "running"
    unpause(other, "e", "ops")
    w.dispatcher.queue.extend(other.dispatcher.queue)
    w.run()
    assert RAN == ["a", "b", "c"] and w.status("e") == "completed"
