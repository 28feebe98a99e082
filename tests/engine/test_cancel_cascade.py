"""Issue 23 item 4 (the simulation's ``operator_compensations`` trigger): withdrawing a parent's
cancel (resume, reset) withdraws what it did to the parent's children, whatever order the
cross-partition writes land in. Each test failed before its fix."""

from __future__ import annotations

from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.children.holders import CHILD_RERUNS, stale_child_outcomes, withdrawn_cancels
from celery_durable.engine.documents.schema import CANCELLED_BY_PARENT, EXEC_ID, marker_id, result_id
from celery_durable.engine.replay.context import require_context
from tests.engine.inprocess import InProcess


def _family(env: InProcess, kids: int) -> str:
    @env.activity
    def echo(x: str) -> str:
        return x

    def kid(n: int) -> str:
        wf.sleep(3600)
        return str(echo(f"kid{n}"))

    kid_def = env.workflow(kid)

    def parent() -> list[str]:
        ctx = require_context("child")
        futures = [ctx.start_child(kid_def, (n,), {}, None) for n in range(kids)]
        return [str(f.result()) for f in futures]

    return env.start(env.workflow(parent))


def _children(env: InProcess, eid: str) -> list[str]:
    return sorted(pk for pk in env.store.scan_partitions("", 50) if pk != eid)


def test_a_cancel_marks_the_children_it_reaches_as_cancelled_by_their_parent() -> None:
    env = InProcess(step_time=1.0)
    eid = _family(env, 2)
    env.engine.cancel(eid)
    env.run()
    kids = _children(env, eid)
    assert [env.status(k) for k in kids] == ["cancelled", "cancelled"]
    assert all(env.ex(k).get(CANCELLED_BY_PARENT) for k in kids)
    assert not env.ex(eid).get(CANCELLED_BY_PARENT)  # cancelled by its caller, not a parent


def test_resume_of_a_cancelled_parent_reopens_every_child_its_cancel_ended() -> None:
    """The parent waited on its first child when cancelled: only that step's outcome was the
    cancel's own; the second child's cancelled end was recorded after as an ordinary failure,
    which the resume kept, so the resumed parent failed on it (ChildWorkflowError)."""
    env = InProcess(step_time=1.0)
    eid = _family(env, 3)
    env.engine.cancel(eid)
    env.run()
    assert env.status(eid) == "cancelled"
    Admin(env.engine).resume(eid)
    env.finish()
    assert (env.status(eid), env.ex(eid).get("result")) == ("completed", ["kid0", "kid1", "kid2"])
    for k in _children(env, eid):
        ops = [d for d in env.store.query_partition(k).docs if d.get("type") == "operation"]
        assert [o["by"] for o in ops] == [f"via parent {eid}"], k


def test_reset_of_a_cancelled_parent_reopens_the_children_its_cancel_ended() -> None:
    env = InProcess(step_time=1.0)
    eid = _family(env, 2)
    env.engine.cancel(eid)
    env.run()
    Admin(env.engine).reset(eid, 3)  # keeps both child steps: they run again, not as failures
    env.finish()
    assert (env.status(eid), env.ex(eid).get("result")) == ("completed", ["kid0", "kid1"])


def test_a_child_outcome_of_a_life_before_the_one_the_step_waits_for_is_dropped() -> None:
    marker = {"id": marker_id(2, 0), "type": "step", "kind": "child", "seq": 2, CHILD_RERUNS: 1}
    docs = {marker["id"]: marker}
    old = {"id": result_id(2, 0), "type": "result", "seq": 2, "run": 0, "child_id": "c", CHILD_RERUNS: 0}
    new = old | {CHILD_RERUNS: 1}
    activity = {"id": result_id(2, 0), "type": "result", "seq": 2, "run": 0}
    assert stale_child_outcomes(docs, 0, [old]) == {2}
    assert stale_child_outcomes(docs, 0, [new]) == set()
    assert stale_child_outcomes(docs, 0, [activity]) == set()
    assert stale_child_outcomes({}, 0, [old]) == set()  # a step never reopened expects any life


def test_a_cancelled_end_of_a_withdrawn_cancel_is_not_recorded() -> None:
    out = {"id": result_id(3, 0), "type": "result", "seq": 3, "run": 0, "child_id": "k", CANCELLED_BY_PARENT: True}
    running = {"id": EXEC_ID, "run": 0, "cancel_requested": False}
    assert withdrawn_cancels(running, {}, [out]) == {3: "k"}
    assert withdrawn_cancels(running | {"cancel_requested": True}, {}, [out]) == {}  # still cancelling
    assert withdrawn_cancels(running, {out["id"]: out}, [out]) == {}  # the step has its outcome
    assert withdrawn_cancels(running, {}, [out | {CANCELLED_BY_PARENT: False}]) == {}  # an operator's cancel
    assert withdrawn_cancels(running | {"status": "failed"}, {}, [out]) == {}  # it ended since: waits for nothing
