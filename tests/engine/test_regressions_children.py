"""Regressions of issue 12 ("Ids"): an explicit child id that is already taken never hangs the parent.

A taken child id resolves to the existing child only if that child is this parent step's own
(same parent, run and step: an earlier attempt's create, or its cancel's fence); otherwise the
step fails with :class:`ChildWorkflowError` (``ChildIdTaken``) and the holder is left alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import ChildWorkflowError, Durable, WorkflowFailedError
from celery_durable import workflow as wf
from celery_durable.engine.dispatcher import ChildRequest
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("reg-children", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="reg.children.job")
def job(n: int) -> int:
    return n * 10


@durable.workflow(name="reg.children.held", signals={"go": int})
def held() -> int:
    return wf.wait_signal("go")


@durable.workflow(name="reg.children.loop")
def loop(n: int, total: int = 0) -> int:
    # a fixed, human-readable child id per iteration of an eternal loop
    total += job.start_child(n, _workflow_id=f"{wf.execution_id()}-job").result()
    if n == 0:
        return total
    wf.continue_as_new(n - 1, total)
    return -1


@durable.workflow(name="reg.children.twice")
def twice() -> str:
    job.start_child(1, _workflow_id="reg-shared-child").result()
    try:
        job.start_child(2, _workflow_id="reg-shared-child").result()
    except ChildWorkflowError as exc:
        return f"refused: {exc}"
    return "second child ran"


@durable.workflow(name="reg.children.victim")
def victim(child_id: str) -> str:
    try:
        return f"joined {held.start_child(_workflow_id=child_id).result()}"
    except ChildWorkflowError as exc:
        return f"refused: {exc.type_name}: {exc.message}"


@durable.workflow(name="reg.children.bad_id")
def bad_id(child_id: Any) -> int:
    return job.start_child(1, _workflow_id=child_id).result()


def _recover(env: WorkflowEnvironment) -> None:
    """What beat does over an hour: recovery scans (children, lost drives) and due clocks."""
    for _ in range(12):
        env.clock.advance(600)
        env.engine.recovery.scan()
        env.engine.timers.fire_due_clocks()
        env.run_until_idle()


def _lose_first_child_start(env: WorkflowEnvironment, child_id: str) -> None:
    """The worker carrying out the parent's commit dies before it starts ``child_id``."""
    real = env.engine.children.start_child
    lost: list[ChildRequest] = []

    def flaky(req: ChildRequest) -> bool:
        if req.child_id == child_id and not lost:
            lost.append(req)
            return False
        return real(req)

    env.engine.children.start_child = flaky  # type: ignore[method-assign]


def test_explicit_child_id_reused_by_the_next_run_does_not_hang_the_parent() -> None:
    """Run 1 starts a child with the id run 0's (finished) child had. The parent must either
    get the new child's result or a clear error -- not wait forever."""
    env = WorkflowEnvironment(durable)
    h = env.start(loop, 1, _workflow_id="reg-loop")
    _recover(env)
    # run 0: 10, run 1: 0 -> 10 (or a ChildWorkflowError failure); never stuck 'running'
    assert h.poll().done, f"parent is still {h.status()} with nothing scheduled: it waits forever"
    with pytest.raises(WorkflowFailedError, match="ChildWorkflowError.*reg-loop-job"):
        h.result(timeout=0)


def test_explicit_child_id_taken_by_an_earlier_child_is_a_clear_error() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(twice, _workflow_id="reg-twice")
    _recover(env)
    assert h.poll().done, f"parent is still {h.status()}: the second child is never started nor refused"
    out = h.result(timeout=0)
    assert out.startswith("refused:") and "ChildIdTaken" in out and "'reg-shared-child'" in out, out
    assert env.handle("reg-shared-child").result(timeout=0) == 10  # the first child is untouched


def test_squatted_child_id_fails_the_step_and_leaves_the_squatter_alone() -> None:
    env = WorkflowEnvironment(durable)
    squatter = env.start(held, _workflow_id="reg-squat-kid")  # someone took the id first
    h = env.start(victim, "reg-squat-kid", _workflow_id="reg-squat")
    env.run_until_idle()
    assert h.poll().done, f"parent is still {h.status()}: it waits for someone else's execution"
    out = h.result(timeout=0)
    assert out.startswith("refused: ChildIdTaken:") and "'reg-squat-kid'" in out and "no parent" in out, out
    assert squatter.status() == "running"
    assert env.signal(squatter, "go", 7)
    env.run_until_idle()
    assert squatter.result(timeout=0) == 7


def test_recovery_refuses_a_squatted_child_id_when_the_first_start_was_lost() -> None:
    env = WorkflowEnvironment(durable)
    env.start(held, _workflow_id="reg-lost-kid")
    _lose_first_child_start(env, "reg-lost-kid")
    h = env.start(victim, "reg-lost-kid", _workflow_id="reg-lost")
    env.run_until_idle()
    assert h.status() == "running"
    _recover(env)
    assert h.poll().done, f"parent is still {h.status()}: recovery never reached a conclusion"
    assert h.result(timeout=0).startswith("refused: ChildIdTaken:")


def test_cancelling_the_parent_never_cancels_a_squatter() -> None:
    env = WorkflowEnvironment(durable)
    squatter = env.start(held, _workflow_id="reg-cancel-kid")
    _lose_first_child_start(env, "reg-cancel-kid")
    h = env.start(victim, "reg-cancel-kid", _workflow_id="reg-cancel")
    env.run_until_idle()
    assert env.cancel(h)
    env.run_until_idle()
    _recover(env)
    assert h.status() == "cancelled"
    assert squatter.status() == "running", "the parent's cancel reached an execution that is not its child"


def test_lost_start_of_an_own_child_is_still_joined_by_recovery() -> None:
    """The same id, created by this parent step (an earlier attempt's create), is joined, not refused."""
    env = WorkflowEnvironment(durable)
    _lose_first_child_start(env, "reg-own-kid")
    h = env.start(victim, "reg-own-kid", _workflow_id="reg-own")
    env.run_until_idle()
    _recover(env)
    child = env.handle("reg-own-kid")
    assert child.status() == "running"
    assert env.signal(child, "go", 3)
    env.run_until_idle()
    assert h.result(timeout=0) == "joined 3"


@pytest.mark.parametrize("child_id", ["", 123])
def test_invalid_explicit_child_id_fails_the_workflow_clearly(child_id: Any) -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(bad_id, child_id)
    env.run_until_idle()
    with pytest.raises(WorkflowFailedError, match="child workflow id"):
        h.result(timeout=0)
