"""Adversarial review of issue 13 (queries, patching, signal channels, local activities, reset):
each test is an input that broke the first version."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import (
    ConfigurationError,
    Durable,
    HistoryUnavailableError,
    QueryFailedError,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import OperationRefused
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-issue13", set_as_current=False)
durable = Durable(app, store="memory://")
calls: list[Any] = []


@durable_activity(name="adv13.loc", local=True)
def loc(x: int) -> int:
    calls.append(("loc", x))
    return x + 1


@durable_activity(name="adv13.rem")
def rem(x: int) -> int:
    calls.append(("rem", x))
    return x * 10


@durable.workflow(name="adv13.can", signals={"v": int})
def can(runs: int, got: list[int]) -> list[int]:
    got = [*got, wf.wait_signal("v")]
    if len(got) < runs:
        wf.continue_as_new(runs, got)
    return got


@durable.workflow(name="adv13.selfsig", signals={"me": str})
def selfsig() -> str:
    wf.signal_external(wf.execution_id(), "me", "hi")
    return str(wf.wait_signal("me"))


@durable.workflow(name="adv13.gather")
def gathered(x: int) -> list[int]:
    return list(wf.gather([loc.s(x), rem.s(x), loc.s(x + 100)]))


@pytest.fixture(autouse=True)
def _clean() -> None:
    calls.clear()


def test_signals_consumed_before_continue_as_new_are_not_consumed_again() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(can, 3, [])
    for v in (1, 2, 3):
        env.signal(h, "v", v)
    assert env.result(h) == [1, 2, 3]


def test_signals_sent_before_start_of_each_run_keep_order() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(can, 2, [])
    env.signal(h, "v", 1)
    env.signal(h, "v", 2)
    env.signal(h, "v", 3)
    assert env.result(h) == [1, 2]


def test_signal_external_to_itself() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(selfsig, _workflow_id="self-1")
    assert env.result(h) == "hi"


def test_gather_of_local_and_remote_runs_each_once() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(gathered, 1)
    assert env.result(h) == [2, 10, 102]
    assert sorted(calls) == [("loc", 1), ("loc", 101), ("rem", 1)]


@durable.workflow(name="adv13.waiter", signals={"go": str})
def waiter() -> str:
    state = {"stage": "waiting"}
    wf.set_query_handler("stage", lambda: state["stage"])
    wf.set_query_handler("bad", lambda: {1, 2})
    got = wf.wait_signal("go")
    state["stage"] = f"got {got}"
    return str(got)


def _prune(env: WorkflowEnvironment, eid: str) -> None:
    for doc in env.store.query_partition(eid).docs:
        if doc["id"] != "exec":
            env.store.delete(eid, doc["id"])


def test_query_of_a_cancelled_and_pruned_history_fails_clearly() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(waiter)
    env.cancel(h)
    assert h.status() == "cancelled"
    assert h.query("stage") == "waiting"
    _prune(env, h.id)
    with pytest.raises(HistoryUnavailableError):
        h.query("stage")


def test_query_returning_a_non_json_value_fails_clearly() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(waiter)
    with pytest.raises(QueryFailedError):
        h.query("bad")


@durable.workflow(name="adv13.kid", signals={"go": int})
def kid() -> int:
    return int(wf.wait_signal("go")) + 1


@durable.workflow(name="adv13.parent")
def parent() -> int:
    child = kid.start_child()
    wf.signal_external(child.workflow_id, "go", 41)  # the id the child's future exposes
    return int(child.result())


@durable.workflow(name="adv13.tells_parent")
def tells_parent(parent_id: str) -> str:
    wf.signal_external(parent_id, "go", 1)
    return "told"


@durable.workflow(name="adv13.mid", signals={"go": int})
def mid() -> int:
    tells_parent.start_child(wf.execution_id()).result()
    return int(wf.wait_signal("go"))


@durable.workflow(name="adv13.top")
def top() -> int:
    return int(mid.start_child().result())


def test_a_parent_signals_the_child_whose_id_its_future_exposes() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(parent)
    assert env.result(h) == 42


def test_a_child_signals_its_derived_id_parent() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(top)
    assert env.result(h) == 1


flaky = {"fail": True}


@durable_activity(name="adv13.maybe")
def maybe(x: int) -> int:
    calls.append(("maybe", x))
    if flaky["fail"]:
        raise ValueError("down")
    return x


@durable.workflow(name="adv13.fragile_kid")
def fragile_kid(x: int) -> int:
    return maybe(x)


@durable.workflow(name="adv13.guardian")
def guardian() -> str:
    try:
        return str(fragile_kid.start_child(7).result())
    except Exception as exc:  # noqa: BLE001 - the parent goes on past its child's failure
        return f"child failed: {type(exc).__name__}"


def test_reset_of_a_child_whose_parent_recorded_its_failure() -> None:
    flaky["fail"] = True
    env = WorkflowEnvironment(durable)
    h = env.start(guardian)
    assert env.result(h) == "child failed: ChildWorkflowError"
    kid_id = f"{h.id}-c1"
    assert env.handle(kid_id).status() == "failed"
    assert env.handle(kid_id).poll().parent_id == h.id
    flaky["fail"] = False
    with pytest.raises(OperationRefused, match=h.id):
        env.handle(kid_id).reset(1)


@durable.workflow(name="adv13.strict_parent")
def strict_parent() -> str:
    return str(fragile_kid.start_child(7).result())


def test_the_parent_reset_the_refusal_advises_runs_a_new_child() -> None:
    flaky["fail"] = True
    env = WorkflowEnvironment(durable)
    h = env.start(strict_parent)
    assert h.status() == "failed"
    flaky["fail"] = False
    with pytest.raises(OperationRefused, match="reset"):
        env.handle(f"{h.id}-c1").reset(1)
    h.reset(1)
    assert env.result(h) == "7"
    # the re-run's child is a new one, its id marked with the rerun count (issue 23 item 2)
    assert env.handle(f"{h.id}-c1~1").status() == "completed"


@pytest.mark.parametrize("option", ["time_limit", "soft_time_limit"])
def test_a_local_activity_refuses_a_time_limit_it_cannot_enforce(option: str) -> None:
    """The drive runs a local activity's function inline: Celery's time limits never apply to
    it, so a limit given would be silently ignored (a 1 s limit, a 3 s function: it completes)."""
    with pytest.raises(ConfigurationError, match=option):

        @durable_activity(name=f"adv13.limited_{option}", local=True, **{option: 1})
        def limited() -> int:
            return 1


@durable.workflow(name="adv13.any_can", signals={"a": int, "b": int})
def any_can(left: int, got: list[str]) -> list[str]:
    name, value = wf.wait_any("a", "b")
    got = [*got, f"{name}{value}"]
    if left > 1:
        wf.continue_as_new(left - 1, got)
    return got


def test_wait_any_across_continue_as_new_takes_each_value_once_in_order() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(any_can, 3, [])
    env.signal(h, "b", 1)
    env.signal(h, "a", 2)
    env.signal(h, "b", 3)
    env.signal(h, "a", 4)
    assert env.result(h) == ["b1", "a2", "b3"]


bad: set[int] = set()


@durable_activity(name="adv13.picky")
def picky(x: int) -> int:
    calls.append(("picky", x))
    if x in bad:
        raise ValueError(f"{x} is bad")
    return x


@durable.workflow(name="adv13.can_fail")
def can_fail(left: int) -> int:
    picky(left)
    if left > 0:
        wf.continue_as_new(left - 1)
    return picky(100)


def test_reset_after_continue_as_new_resets_the_current_run() -> None:
    env = WorkflowEnvironment(durable)
    bad.add(100)
    h = env.start(can_fail, 1)
    assert h.status() == "failed"
    bad.clear()
    calls.clear()
    h.reset(2)  # run 1: step 1 picky(0) kept, step 2 picky(100) runs again
    assert env.result(h) == 100
    assert calls == [("picky", 100)]
    bad.add(100)
    h2 = env.start(can_fail, 1)
    with pytest.raises(OperationRefused, match="steps 1 to 2"):  # the current run's steps
        h2.reset(4)
    bad.clear()


@durable.workflow(name="adv13.local_then_wait", signals={"go": int})
def local_then_wait(x: int) -> int:
    seen = {"n": 0}
    wf.set_query_handler("n", lambda: seen["n"])
    seen["n"] = loc(x)
    wf.wait_signal("go")
    seen["n"] = loc(seen["n"])
    return seen["n"]


def test_a_query_reaching_a_new_local_step_runs_nothing() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(local_then_wait, 1)
    assert h.query("n") == 2
    # a value the drive has not taken yet (its drive is still queued): the query's replay
    # decides the wait and reaches the second local step, which it must not run
    env.engine.signal(h.id, "go", 5)
    queued = len(env.dispatcher.queue)
    before = {d["id"]: d["_etag"] for d in env.store.query_partition(h.id).docs}
    calls.clear()
    assert h.query("n") == 2
    assert calls == [] and len(env.dispatcher.queue) == queued
    assert {d["id"]: d["_etag"] for d in env.store.query_partition(h.id).docs} == before
