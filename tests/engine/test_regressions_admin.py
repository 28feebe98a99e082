"""Regressions of the operator operations (``engine/admin/operator.py``). Moved from ``tests/adversarial``;
the saga test failed before ``retry`` forgot what was recorded after the failed step; the resume,
handled-failure and purge tests failed before resume ordered by steps (not clocks), retry re-ran
the step whose failure ended the execution (not the last failed one) and purge admitted intents."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ActivityError, StoreError, WorkflowCancelledError
from celery_durable.testing.env import WorkflowEnvironment
from tests.engine.inprocess import InProcess


class Env(InProcess):
    def __init__(self) -> None:
        super().__init__(step_time=1.0)
        self.admin = Admin(self.engine)
        self.ran: list[str] = []


@pytest.fixture
def env() -> Env:
    return Env()


def _saga(env: Env, fixed: dict[str, bool]) -> Any:
    @env.activity
    def reserve() -> str:
        env.ran.append("reserve")
        return "r"

    @env.activity
    def release() -> str:
        env.ran.append("release")
        return "released"

    @env.activity
    def charge() -> str:
        env.ran.append("charge")
        if not fixed:
            raise ConnectionError("card processor down")
        return "charged"

    @env.activity
    def ship() -> str:
        env.ran.append("ship")
        return "shipped"

    def order() -> str:
        with wf.Saga() as saga:
            reserve()
            saga.add(release)
            charge()
            ship()
        return "done"

    return env.registry.add_workflow("order", order)


def test_retry_of_a_saga_reruns_from_the_failed_step(env: Env) -> None:
    """A workflow that compensated before failing has steps recorded *after* the failed step; retry
    kept them, so the re-run met the compensation where the code now goes on (NonDeterminismError)."""
    fixed: dict[str, bool] = {}
    eid, _ = env.engine.start(_saga(env, fixed), (), {}, workflow_id="adv-order")
    env.run()
    assert env.ex(eid)["status"] == "failed"
    assert env.ran == ["reserve", "charge", "release"]
    generation = int(env.ex(eid).get("generation") or 0)

    fixed["yes"] = True
    rerun = env.admin.retry(eid)
    assert [(s.seq, s.name) for s in rerun] == [(2, "charge")]
    ex = env.ex(eid)
    assert ex["status"] == "running" and ex["steps"] == 2 and int(ex["generation"]) > generation
    assert {"s:000003", "r:000003"}.isdisjoint(env.ids(eid))  # the compensation is forgotten
    env.run()
    ex = env.ex(eid)
    assert (ex["status"], ex.get("error")) == ("completed", None), ex.get("error")
    assert ex["result"] == "done"
    assert env.ran == ["reserve", "charge", "release", "charge", "ship"]


def test_retry_forgets_signal_decisions_after_the_failed_step(env: Env) -> None:
    """A value consumed by a wait after the failed step is pending again: the re-run takes it."""
    fixed: dict[str, bool] = {}

    @env.activity
    def flaky() -> str:
        if not fixed:
            raise ValueError("bad")
        return "ok"

    def flow() -> str:
        try:
            first = flaky()
        except Exception:
            wf.now()  # the failure path records other steps than the re-run will take
            got = wf.wait_signal("go", str)  # after the failure: a compensation waiting for a human
            raise RuntimeError(f"gave up after {got}") from None
        return first + ":" + wf.wait_signal("go", str)

    d = env.registry.add_workflow("flow", flow)
    eid, _ = env.engine.start(d, (), {}, workflow_id="sig-retry")
    env.run()
    assert env.engine.signal(eid, "go", "v1") is True
    env.run()
    assert env.ex(eid)["status"] == "failed"
    fixed["yes"] = True
    env.admin.retry(eid)
    env.run()
    ex = env.ex(eid)
    assert (ex["status"], ex["result"]) == ("completed", "ok:v1"), ex.get("error")


def test_retry_forgets_finished_children_of_later_steps_and_refuses_while_one_runs(env: Env) -> None:
    """A child started after the failed step belongs to the forgotten history. A finished one is
    deleted, so the re-run starts its own under the same derived id; a running one would outlive
    the history it belongs to, so retry refuses until it has ended (cancel it first)."""
    fixed: dict[str, bool] = {}

    @env.activity
    def flaky() -> str:
        env.ran.append("flaky")
        if not fixed:
            raise ValueError("bad")
        return "ok"

    def kid(tag: str) -> str:
        env.ran.append(f"kid {tag}")
        if tag == "wait":
            wf.wait_signal("never", str)
        return tag

    kid_def = env.registry.add_workflow("kid", kid)

    def parent(tag: str) -> str:
        try:
            flaky()
        except Exception:
            kid_future = require_context("child").start_child(kid_def, (tag,), {}, None)
            wf.sleep(10)  # recorded and suspended: the child is started
            if tag != "wait":
                kid_future.result()
            raise
        return "done"

    d = env.registry.add_workflow("parent", parent)
    eid, _ = env.engine.start(d, ("x",), {}, workflow_id="P")
    env.run()
    env.clock.advance(10)
    env.engine.timers.fire_due_clocks()
    env.run()
    assert env.ex(eid)["status"] == "failed" and env.ex("P-c2")["status"] == "completed"
    fixed["yes"] = True
    env.admin.retry(eid)
    assert "exec" not in env.ids("P-c2")  # forgotten with the step that started it
    env.run()
    assert env.ex(eid)["status"] == "completed"

    eid, _ = env.engine.start(d, ("wait",), {}, workflow_id="Q")
    fixed.clear()
    env.run()
    env.clock.advance(10)
    env.engine.timers.fire_due_clocks()
    env.run()
    assert env.ex(eid)["status"] == "failed" and env.ex("Q-c2")["status"] == "running"
    fixed["yes"] = True
    with pytest.raises(OperationRefused, match="Q-c2"):
        env.admin.retry(eid)
    assert env.ex(eid)["status"] == "failed"
    env.engine.cancel("Q-c2")
    env.run()
    env.admin.retry(eid)
    env.run()
    assert (env.ex(eid)["status"], env.ex(eid)["result"]) == ("completed", "done")


def test_retry_refuses_while_a_later_step_is_still_running(env: Env) -> None:
    """Its outcome would land on whatever step the re-run records under the same number."""
    eid, _ = env.engine.start(_saga(env, {}), (), {}, workflow_id="busy")
    env.run()
    marker = env.store.read(eid, "s:000003")  # the compensation, made to look still running
    assert marker is not None and env.ex(eid)["status"] == "failed"
    lease = {"holder": "elsewhere", "expires": env.clock.now() + 60}
    env.store.replace({k: v for k, v in marker.items() if not k.startswith("_")} | {"lease": lease}, marker["_etag"])
    with pytest.raises(OperationRefused, match="step 3 .release. of busy is still running"):
        env.admin.retry(eid)
    assert env.ex(eid)["status"] == "failed" and "r:000003" in env.ids(eid)


# --- resume decides "from the cancel on" by step order ------------------------------------------


def _cancelled_order(env: Env, skew: float) -> str:
    """``charge`` finished, the workflow sleeps; the cancel is delivered by a drive whose clock
    reads ``skew`` seconds from the step's (0: a coarse clock; negative: a worker running behind)."""

    @env.activity
    def charge() -> str:
        env.ran.append("charge")
        return "charged"

    def order() -> str:
        charge()
        wf.sleep(3600)
        return "done"

    d = env.registry.add_workflow("adv.resume.order", order)
    eid, _ = env.engine.start(d, (), {}, workflow_id="adv-resume")
    env.worker.run()
    assert env.ran == ["charge"]
    env.clock.t += skew  # a second worker's clock (FakeClock.advance refuses to go back)
    env.engine.cancel(eid)
    env.worker.run()
    assert env.ex(eid)["status"] == "cancelled"
    return eid


@pytest.mark.parametrize("skew", [0.0, -5.0], ids=["same-clock-reading", "slower-clock"])
def test_resume_after_cancel_does_not_rerun_a_step_finished_before_it(env: Env, skew: float) -> None:
    """Resume compared wall clocks (``created_at >= since``): a step recorded at the cancel's clock
    reading, or any step when the cancelling worker's clock is behind, lost its result and ran again."""
    eid = _cancelled_order(env, skew)
    env.admin.resume(eid)
    env.worker.run()
    env.clock.advance(3700)
    env.engine.timers.fire_due_clocks()
    env.worker.run()
    assert env.ex(eid)["status"] == "completed"
    assert env.ran == ["charge"], f"a step finished before the cancel ran again: {env.ran}"


def test_resume_keeps_a_finished_step_numbered_after_the_interrupted_one(env: Env) -> None:
    """The cancel's outcome goes to the step waited for (1) while step 2, started later, had already
    finished: step 2 is before the cancel in the code and keeps its result; the compensation goes."""

    @env.activity
    def act(what: str) -> str:
        env.ran.append(what)
        return what

    def flow() -> str:
        timer = wf.start_timer(3600)  # step 1
        act("charge")  # step 2: finishes before the cancel
        try:
            timer.result()  # the cancel is delivered here, as step 1's outcome
        except Exception:
            act("refund")  # step 3: the compensation
            raise
        return act("ship")

    d = env.registry.add_workflow("adv.resume.later", flow)
    eid, _ = env.engine.start(d, (), {}, workflow_id="adv-resume-later")
    env.run()
    env.engine.cancel(eid)
    env.run()
    assert env.ex(eid)["status"] == "cancelled" and env.ran == ["charge", "refund"]
    env.admin.resume(eid)
    env.run()
    env.clock.advance(3600)
    env.engine.timers.fire_due_clocks()
    env.run()
    assert (env.ex(eid)["status"], env.ex(eid).get("result")) == ("completed", "ship"), env.ex(eid).get("error")
    assert env.ran == ["charge", "refund", "ship"]


# --- retry re-runs the step whose failure ended the execution ------------------------------------


def test_retry_after_a_code_bug_does_not_rerun_work_done_after_a_handled_failure(env: Env) -> None:
    """Retry took the run's last failed step, though the workflow had caught that failure and gone
    on: the work after it (a charge) was forgotten and ran again."""
    fixed: dict[str, bool] = {}

    @env.activity
    def try_discount() -> str:
        env.ran.append("try_discount")
        raise ValueError("no discount today")  # an expected, handled failure

    @env.activity
    def charge() -> str:
        env.ran.append("charge")
        return "charged"

    def order() -> str:
        try:
            try_discount()
        except ActivityError:
            pass  # handled: go on at full price
        receipt = charge()
        if not fixed:
            raise RuntimeError("bug in the workflow code after the charge")
        return receipt

    d = env.registry.add_workflow("adv.retry.order", order)
    eid, _ = env.engine.start(d, (), {}, workflow_id="adv-retry-caught")
    env.run()
    error = env.ex(eid)["error"]
    assert env.ex(eid)["status"] == "failed"
    fixed["yes"] = True  # the deploy fixing the bug
    assert env.admin.retry(eid) == []  # nothing re-run: re-driven as it is
    env.run()
    ex = env.ex(eid)
    assert (ex["status"], ex.get("result")) == ("completed", "charged"), ex.get("error")
    assert env.ran.count("charge") == 1, f"the card was charged again by the operator's retry: {env.ran}"
    assert error["step"] is None  # recorded: no step's failure ended it


def test_retry_reruns_the_step_a_gather_raised_or_a_compensation_gave_up_on(env: Env) -> None:
    """The failure that ended it is recorded: the first failure of a gather, by position (not the
    last failed step), or the step whose failure the error escaping was raised while handling."""
    fixed: dict[str, bool] = {}

    @env.activity
    def part(n: int) -> int:
        env.ran.append(f"part {n}")
        if n in (1, 3) and not fixed:
            raise ValueError(f"part {n} down")
        return n

    def flow() -> int:
        try:
            # steps 1-3 all finish, 1 and 3 failed: the gather raises step 1's (the first by position)
            total = sum(wf.gather(*(SimpleNamespace(task="part", args=(n,), kwargs={}) for n in (1, 2, 3))))
        except ActivityError as exc:
            raise RuntimeError("order failed") from exc  # another error type, caused by the step's
        return total

    d = env.registry.add_workflow("adv.retry.gather", flow)
    eid, _ = env.engine.start(d, (), {}, workflow_id="adv-retry-gather")
    env.run()
    error = env.ex(eid)["error"]
    assert (env.ex(eid)["status"], error["type"]) == ("failed", "RuntimeError")
    fixed["yes"] = True
    assert [(s.seq, s.name) for s in env.admin.retry(eid)] == [(1, "part")]
    assert (error["step"], error["taken"]) == (1, 3)
    env.run()
    # the siblings keep their outcomes: 2 does not run again, and 3's failure now ends it
    assert (env.ex(eid)["status"], env.ex(eid)["error"]["step"]) == ("failed", 3)
    assert [(s.seq, s.name) for s in env.admin.retry(eid)] == [(3, "part")]
    env.run()
    assert (env.ex(eid)["status"], env.ex(eid).get("result")) == ("completed", 6), env.ex(eid).get("error")
    assert sorted(env.ran) == ["part 1", "part 1", "part 2", "part 3", "part 3"]


# --- purge admits an emitted effect before deleting its intent -----------------------------------

app = Celery("regressions-admin", set_as_current=False)
durable = Durable(app, store="memory://")
SENT: list[str] = []


class Mail(BaseModel):
    to: str


@durable.effect("adv.purge.mail")
def mail(msg: Mail) -> None:
    SENT.append(msg.to)


@durable.workflow(name="adv.purge.welcome")
def welcome(to: str) -> str:
    wf.emit("adv.purge.mail", Mail(to=to))
    return "ok"


def _ended_with_an_unadmitted_emit() -> tuple[WorkflowEnvironment, str]:
    SENT.clear()
    env = WorkflowEnvironment(durable)
    env.engine._admit = lambda req: None  # type: ignore[method-assign]  # the worker dies after its commit
    h = env.start(welcome, "ann@example.com", _workflow_id="adv-purge-welcome")
    assert h.status() == "completed"
    del env.engine._admit
    # beat (and its outbox scan) is down for two days; the operator purges what ended a day ago
    env.clock.advance(timedelta(days=2).total_seconds())
    return env, h.id


def test_purge_keeps_an_emitted_effect_that_was_not_admitted_yet() -> None:
    """Purge deleted the un-admitted ``emit`` marker with the execution: the scan had nothing left
    to admit and the effect of the completed workflow never ran."""
    env, _ = _ended_with_an_unadmitted_emit()
    report = Admin(env.engine).purge(older_than=timedelta(days=1).total_seconds())
    assert (report.purged, report.skipped) == (1, 0)
    env.advance(timedelta(minutes=1))  # beat is back; the worker runs what was admitted
    env.advance(timedelta(minutes=1))
    assert SENT == ["ann@example.com"], "the effect the completed workflow emitted was lost"


def test_purge_keeps_an_execution_whose_emit_cannot_be_admitted_and_says_why() -> None:
    env, eid = _ended_with_an_unadmitted_emit()
    admit = env.engine.outbox.admit_intent

    def down(doc: dict[str, Any]) -> Any:
        raise StoreError("lane partition unavailable")

    env.engine.outbox.admit_intent = down  # type: ignore[method-assign]
    report = Admin(env.engine).purge(older_than=timedelta(days=1).total_seconds())
    assert (report.matched, report.purged, report.skipped) == (1, 0, 1)
    assert len(report.kept) == 1 and report.kept[0].startswith(f"{eid}: ") and "could not be admitted" in report.kept[0]
    assert env.engine.store.read(eid, "exec") is not None
    env.engine.outbox.admit_intent = admit  # type: ignore[method-assign]
    report = Admin(env.engine).purge(older_than=timedelta(days=1).total_seconds())
    assert (report.purged, report.skipped) == (1, 0)
    env.advance(timedelta(minutes=1))
    assert SENT == ["ann@example.com"]


@durable.workflow(name="adv.resume.notify")
def notify_on_cancel(to: str) -> str:
    try:
        wf.sleep(3600)
    except WorkflowCancelledError:
        wf.emit("adv.purge.mail", Mail(to=to))  # the compensation: tell the customer
        raise
    return "ok"


def test_resume_admits_an_effect_a_forgotten_compensation_emitted() -> None:
    """Resume forgets the compensation's steps; an emit among them not admitted yet was deleted
    with them, so an effect the cancelled workflow had emitted was lost. It is admitted first."""
    SENT.clear()
    env = WorkflowEnvironment(durable)
    env.engine._admit = lambda req: None  # type: ignore[method-assign]  # the worker dies after its commit
    h = env.start(notify_on_cancel, "bob@example.com", _workflow_id="adv-resume-notify")
    assert env.cancel(h) is True
    env.run_until_idle()
    assert h.status() == "cancelled"
    del env.engine._admit
    Admin(env.engine).resume(h.id)
    env.run_until_idle()
    env.advance(timedelta(minutes=1))
    assert SENT == ["bob@example.com"] and h.status() == "running"
