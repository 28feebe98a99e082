"""Operator operations and the attempts still running or queued for the steps they re-arm or forget.

An operation that sends a step again while an attempt of it still holds a live lease would run
the activity twice at once: resume and reset refuse, as retry does. An outcome (or a queued
message) of a step the operation forgot never completes the step the re-run takes anew under
the same number (engine/activities/delivery.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.activities.delivery import Delivery, stale_outcomes
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.errors import WorkflowCancelledError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("op-leases", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
calls: list[str] = []
broken = {"label": True}


@durable_activity(name="opl.ship")
def ship(addr: str) -> str:
    calls.append("ship " + addr)
    return "shipped to " + addr


@durable_activity(name="opl.refund")
def refund(what: str) -> str:
    calls.append("refund " + what)
    return "refunded " + what


@durable_activity(name="opl.label")
def label(order: str) -> str:
    if broken["label"]:
        raise NonRetryableError("printer out of paper")
    return "LBL-" + order


@durable.workflow(name="opl.one")
def one() -> str:
    return ship("home")


@durable.workflow(name="opl.saga")
def saga() -> str:
    try:
        wf.sleep(3600)
    except WorkflowCancelledError:
        refund.start("order")  # a compensation not waited for: still running when the workflow ends
        wf.sleep(5)
        raise
    return "done"


@durable.workflow(name="opl.notify")
def notify() -> str:
    printed = label.start("o")
    told = ship.start("the customer")  # pending when the label fails: a retry forgets it, the re-run takes it anew
    printed.result()
    return told.result()


@pytest.fixture
def env() -> WorkflowEnvironment:
    calls.clear()
    broken["label"] = True
    return WorkflowEnvironment(durable)


def _stall(env: WorkflowEnvironment, name: str, held: list[Any], begin: bool = True) -> Callable[[Any], None]:
    """Messages of activity ``name`` wait in ``held``: the first one taken by a worker that
    stalls in the call (its attempt, lease live), unless not ``begin``; later ones queued.
    Returns the worker's handler (to deliver a held message)."""
    real = env.dispatcher.handlers["activity"]

    def hold(req: Any) -> None:
        if req.name != name:
            return real(req)
        if begin and not held:
            attempt, why = env.engine.activities.begin(
                req.execution_id, req.seq, req.run, delivery=Delivery.of_request(req)
            )
            assert attempt is not None, why
            req = attempt
        held.append(req)
        return None

    env.dispatcher.handlers["activity"] = hold
    return real  # the worker's own handler


def test_reset_past_a_cancelled_step_whose_attempt_runs_is_refused(env: WorkflowEnvironment) -> None:
    """reset withdraws a cancel recorded before its step: the cancelled step is armed again and
    sent. Its attempt still runs (lease live): sent again, the activity would run twice at once."""
    held: list[Any] = []
    deliver = _stall(env, "opl.ship", held)
    h = env.start(one, _workflow_id="opl-1")
    env.run_until_idle()
    env.engine.cancel(h.id, by="ops")
    env.run_until_idle()
    assert h.status() == "cancelled" and len(held) == 1
    with pytest.raises(OperationRefused, match="still running"):
        Admin(env.engine).reset(h.id, step=2, by="ops")
    env.run_until_idle()
    assert h.status() == "cancelled" and calls == []
    env.clock.advance(env.engine.settings.lease_ttl + 1)  # the stalled attempt is gone (its lease lapsed)
    Admin(env.engine).reset(h.id, step=2, by="ops")
    env.run_until_idle()
    deliver(held[-1])
    env.run_until_idle()
    assert env.result(h) == "shipped to home" and calls == ["ship home"]


def test_resume_while_a_compensation_runs_is_refused(env: WorkflowEnvironment) -> None:
    """resume forgets the compensations (the steps after the cancel point); one still running
    (not waited for by the code) would record nothing, and run beside the resumed run's steps."""
    held: list[Any] = []
    _stall(env, "opl.refund", held)
    h = env.start(saga, _workflow_id="opl-2")
    env.run_until_idle()
    env.engine.cancel(h.id, by="ops")
    env.run_until_idle()
    env.clock.advance(5)  # the compensation's sleep ends; its refund still runs
    env.engine.timers.fire_due_clocks()
    env.run_until_idle()
    assert h.status() == "cancelled" and len(held) == 1  # the compensation still runs
    with pytest.raises(OperationRefused, match="running"):
        Admin(env.engine).resume(h.id, by="ops")
    env.clock.advance(env.engine.settings.lease_ttl + 1)  # the stalled attempt is gone (its lease lapsed)
    Admin(env.engine).resume(h.id, by="ops")
    attempt = held[0]  # it ends at last: its step was forgotten, its outcome is not recorded
    env.engine.activities.complete(attempt, env.engine.activities.result_doc(attempt, value="refunded order"))
    env.clock.advance(3600)
    env.engine.timers.fire_due_clocks()
    env.run_until_idle()
    assert env.result(h) == "done" and calls == []


def test_a_queued_message_of_a_step_a_retry_forgot_does_not_complete_the_reruns_step(
    env: WorkflowEnvironment,
) -> None:
    """retry rotates the failed step's token; a step pending beside it (forgotten) is taken anew
    by the re-run under the same number, same activity, same arguments: its new marker's token
    differs (every operation bumps ``reruns``), so the old queued message is stale."""
    held: list[Any] = []
    deliver = _stall(env, "opl.ship", held, begin=False)
    h = env.start(notify, _workflow_id="opl-3")
    env.run_until_idle()
    assert h.status() == "failed" and len(held) == 1
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="ops")
    env.run_until_idle()
    assert h.status() == "running" and len(held) == 2  # the re-run took step 2 again, its message queued
    old, new = held
    assert (old.seq, old.name, old.args) == (new.seq, new.name, new.args) and old.token != new.token
    before = env.engine.counters.snapshot().get("activity_stale_delivery", 0)
    assert env.engine.activities.begin(old.execution_id, old.seq, old.run, delivery=Delivery.of_request(old))[0] is None
    assert env.engine.counters.snapshot()["activity_stale_delivery"] == before + 1
    deliver(new)
    env.run_until_idle()
    assert env.result(h) == "shipped to the customer" and calls == ["ship the customer"]


def test_an_attempt_of_a_step_a_retry_forgot_does_not_complete_the_reruns_step(env: WorkflowEnvironment) -> None:
    """As above, but the forgotten step's attempt had begun (and stalled, its lease lapsed): its
    outcome, recorded when it ends, is dropped (engine/activities/delivery.py ``stale_outcomes``)."""
    held: list[Any] = []
    deliver = _stall(env, "opl.ship", held)
    labels: list[Any] = []
    env.dispatcher.handlers["activity"] = (stall := env.dispatcher.handlers["activity"])
    env.dispatcher.handlers["activity"] = lambda req: labels.append(req) if req.name == "opl.label" else stall(req)
    h = env.start(notify, _workflow_id="opl-4")
    env.run_until_idle()
    assert len(held) == 1 and len(labels) == 1  # ship's attempt runs before the label fails
    env.dispatcher.handlers["activity"] = stall
    deliver(labels[0])
    env.run_until_idle()
    assert h.status() == "failed"
    env.clock.advance(env.engine.settings.lease_ttl + 1)
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="ops")
    env.run_until_idle()
    assert len(held) == 2
    old, new = held
    before = env.engine.counters.snapshot().get("activity_stale_delivery", 0)
    env.engine.activities.complete(old, env.engine.activities.result_doc(old, value="from the old run"))
    assert env.engine.counters.snapshot()["activity_stale_delivery"] == before + 1
    assert not any(d.get("value") == "from the old run" for d in env.store.query_partition(h.id).docs)
    deliver(new)
    env.run_until_idle()
    assert env.result(h) == "shipped to the customer" and calls == ["ship the customer"]


def test_stale_outcomes_names_outcomes_whose_marker_is_another_or_gone() -> None:
    marker = {"id": "s:000001", "kind": "activity", "token": "t1"}
    legacy = {"id": "s:000002", "kind": "activity"}
    docs = {"s:000001": marker, "s:000002": legacy}

    def result(seq: int, run: int = 0) -> dict[str, Any]:
        return {"type": "result", "seq": seq, "run": run}

    assert stale_outcomes(docs, 0, [result(1)], {1: "t1"}) == set()
    assert stale_outcomes(docs, 0, [result(1)], {1: "t0"}) == {1}  # taken anew after a reset
    assert stale_outcomes(docs, 0, [result(2)], {2: None}) == set()  # a legacy marker and attempt
    assert stale_outcomes(docs, 0, [result(2)], {2: "t1"}) == {2}
    assert stale_outcomes(docs, 0, [result(3)], {3: "t3"}) == {3}  # forgotten, not taken again yet
    assert stale_outcomes(docs, 0, [result(3, run=1)], {3: "t3"}) == set()  # another run: not ours
    assert stale_outcomes(docs, 0, [result(1)], {}) == set()  # no attempt's: not checked


def test_an_outcome_recorded_on_a_failed_execution_as_a_retry_commits_is_fenced(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late outcome on a terminal execution was created as it stood: a retry committing between
    the drive's read (the old marker there: the check passes) and that write left it on the
    forgotten step's number, where the re-run took it as its own step's outcome. The write is
    conditional on the exec's etag (which the retry changes): it conflicts, is read again, dropped."""
    import celery_durable.engine.drive.driver as driver_module

    held: list[Any] = []
    deliver = _stall(env, "opl.ship", held)
    labels: list[Any] = []
    stall = env.dispatcher.handlers["activity"]
    env.dispatcher.handlers["activity"] = lambda req: labels.append(req) if req.name == "opl.label" else stall(req)
    h = env.start(notify, _workflow_id="opl-5")
    env.run_until_idle()
    env.dispatcher.handlers["activity"] = stall
    deliver(labels[0])
    env.run_until_idle()
    assert h.status() == "failed" and len(held) == 1
    env.clock.advance(env.engine.settings.lease_ttl + 1)
    broken["label"] = False
    real_settle = driver_module.settle
    fired: list[bool] = []

    def settle_then_retry(eng: Any, ex: Any, docs: Any) -> bool:
        if not fired:  # the operator's retry commits just after the drive read the partition
            fired.append(True)
            Admin(env.engine).retry(h.id, by="ops")
        return real_settle(eng, ex, docs)

    monkeypatch.setattr(driver_module, "settle", settle_then_retry)
    env.engine.cache.invalidate(h.id)  # the drive reads the failed execution (not begin's copy)
    old = held[0]
    env.engine.activities.complete(old, env.engine.activities.result_doc(old, value="from the old run"))
    monkeypatch.setattr(driver_module, "settle", real_settle)
    assert fired
    env.run_until_idle()
    assert not any(d.get("value") == "from the old run" for d in env.store.query_partition(h.id).docs)
    deliver(held[-1])
    env.run_until_idle()
    assert env.result(h) == "shipped to the customer" and calls == ["ship the customer"]


@durable.workflow(name="opl.kid")
def kid() -> str:
    return ship("kid")


@durable.workflow(name="opl.mom")
def mom() -> str:
    return kid.start_child(_workflow_id=f"{wf.execution_id()}-kid").result()


def test_resume_of_a_parent_whose_cancelled_child_still_runs_a_step_is_refused_before_any_write(
    env: WorkflowEnvironment,
) -> None:
    """resume reopens the parent, then resumes its cancelled child (a cascade after the parent's
    commit). The child's step still running refuses the child's resume: refused only then, the
    parent was left reopened, waiting on a child still cancelled. The cascade is planned first."""
    held: list[Any] = []
    deliver = _stall(env, "opl.ship", held)
    h = env.start(mom, _workflow_id="opl-6")
    env.run_until_idle()
    assert len(held) == 1
    env.engine.cancel(h.id, by="ops")
    env.run_until_idle()
    child = env.handle("opl-6-kid")
    assert (h.status(), child.status()) == ("cancelled", "cancelled")
    with pytest.raises(OperationRefused, match="running"):
        Admin(env.engine).resume(h.id, by="ops")
    assert (h.status(), child.status()) == ("cancelled", "cancelled")
    assert [o["action"] for o in Admin(env.engine).describe(h.id).operations] == ["cancel"]
    env.clock.advance(env.engine.settings.lease_ttl + 1)  # the stalled attempt is gone
    Admin(env.engine).resume(h.id, by="ops")
    env.run_until_idle()
    deliver(held[-1])
    env.run_until_idle()
    assert env.result(h) == "shipped to kid" and calls == ["ship kid"]
