"""Regressions of issue 12 ("edges"): workflow ids and child ids.

* A caller's workflow id is checked at ``start()``/``start_child()`` (:class:`InvalidWorkflowId`):
  a non-empty string of at most 200 characters, no control character, no prefix of the engine's
  own partitions (outbox ``fxq:``/``fxid:``, Cosmos' ``_due:``), and not the form of a derived
  child id (``<parent>-c<step>``), so no one can take a default child id before its parent does.
* A taken explicit child id never hangs the parent: it is joined when the holder is this parent's
  child started with the same workflow and input, else the step fails with ``ChildWorkflowError``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import ChildWorkflowError, Durable, WorkflowFailedError
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.dispatcher import ChildRequest
from celery_durable.engine.documents.checks import MAX_WORKFLOW_ID_LENGTH, check_workflow_id
from celery_durable.engine.documents.schema import child_execution_id
from celery_durable.errors import InvalidWorkflowId
from celery_durable.retry import RetryPolicy
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("reg-ids", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="reg.ids.child")
def child(x: str) -> str:
    return x


@durable.workflow(name="reg.ids.held", signals={"go": str})
def held(tag: str) -> str:
    return tag + str(wf.wait_signal("go"))


@durable.workflow(name="reg.ids.parent")
def parent() -> str:
    return child.start_child("default").result()


@durable.workflow(name="reg.ids.twice")
def twice(first: str, second: str) -> str:
    # /work/shared/repro/peer/repro_child_id.py: the same explicit child id, twice
    a = child.start_child(first, _workflow_id="reg-ids-fixed").result()
    try:
        b = child.start_child(second, _workflow_id="reg-ids-fixed").result()
    except ChildWorkflowError as exc:
        return f"refused: {exc.type_name}: {exc.message}"
    return a + b


@durable.workflow(name="reg.ids.both")
def both(child_id: str) -> str:
    """Two futures on one running child (the second start joins the first)."""
    f1 = held.start_child("t", _workflow_id=child_id)
    f2 = held.start_child("t", _workflow_id=child_id)
    return f1.result() + "|" + f2.result()


@durable.workflow(name="reg.ids.bad_child")
def bad_child(child_id: Any) -> str:
    try:
        child.start_child("x", _workflow_id=child_id)
    except InvalidWorkflowId as exc:  # raised at the call, so the workflow can handle it
        return f"invalid: {exc}"
    return "started"


@durable.effect("reg.ids.stuck", retry=RetryPolicy(initial_interval=timedelta(hours=1), maximum_attempts=5))
def stuck(n: int) -> None:
    raise ConnectionError("down")


@durable.workflow(name="reg.ids.emitter")
def emitter() -> str:
    return wf.emit("reg.ids.stuck", 1, key="lane-a")


BAD_IDS: list[Any] = [
    "",
    "   ",
    123,
    b"bytes",
    "x" * (MAX_WORKFLOW_ID_LENGTH + 1),
    "line\nbreak",
    "nul\x00",
    "tab\tid",
    "del\x7f",
    "surrogate\ud800",
    # bidi overrides/isolates and invisible characters: "order-\u202e24" shows as "order-42" (issue 23)
    "order-\u202e24",
    "order-\u2066x\u2069",
    "order\u200b-42",
    "order-4\u200d2",
    "\ufefforder-42",
    "order\u00ad-42",
    "order\u2028-42",
    # drawn as nothing though not format characters (Default_Ignorable), other spaces, non-NFC
    "order-1\u034f",
    "order-1\ufe0f",
    "order-1\u3164",
    "order\u00a0-42",
    "cafe\u0301",
    "fxq:lane-a",
    "fxid:some-effect",
    "_due:clock:123",
    "victim-c1",
    "victim-c12.r3",
    "a-c1-c2",
]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_start_refuses_an_invalid_workflow_id_in_the_caller(bad: Any) -> None:
    env = WorkflowEnvironment(durable)
    with pytest.raises(InvalidWorkflowId, match="workflow id"):
        env.start(child, "x", _workflow_id=bad)
    assert env.store.scan_partitions("", 100) == []  # nothing stored, nothing sent


@pytest.mark.parametrize("bad", ["", "fxq:k", "v-c1", "a\nb"], ids=repr)
def test_app_start_refuses_an_invalid_workflow_id(bad: str) -> None:
    """The Celery glue's ``Workflow.start`` goes through the same check (no worker needed: it raises first)."""
    with pytest.raises(InvalidWorkflowId):
        child.start("x", _workflow_id=bad)
    assert issubclass(InvalidWorkflowId, ValueError)


@pytest.mark.parametrize(
    "good", ["order-42", "a/b c?#", "ünïcödé-✓", "x" * MAX_WORKFLOW_ID_LENGTH, "fx:abc", "v-c", "v-c1x", "_due"]
)
def test_ordinary_ids_are_accepted(good: str) -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(child, "x", _workflow_id=good)
    assert h.id == good and h.result(timeout=0) == "x"


def test_derived_child_ids_have_the_reserved_form() -> None:
    """The check and ``child_execution_id`` must agree, or default child ids could be squatted again."""
    for run, seq in [(0, 1), (0, 11), (1, 1), (12, 345)]:
        with pytest.raises(InvalidWorkflowId):
            durable.engine.start(child.definition, ("x",), {}, workflow_id=child_execution_id("p", run, seq))


def test_a_derived_id_may_name_an_existing_execution_not_start_one() -> None:
    """``derived_ok`` (signal targets): the tails ``child_execution_id`` makes, nested too, are
    stripped and what is left obeys the caller's rules; an id of tails only names no parent."""
    grandchild = child_execution_id(child_execution_id("p", 1, 3), 0, 12)
    assert check_workflow_id(grandchild, derived_ok=True) == grandchild
    for bad in ["-c1", "-c1.r2-c3", " -c1", "fxq:x-c1", "\nx-c1", "x" * (MAX_WORKFLOW_ID_LENGTH + 1) + "-c1", 3]:
        with pytest.raises(InvalidWorkflowId):
            check_workflow_id(bad, derived_ok=True)
    with pytest.raises(InvalidWorkflowId, match="derived child id"):
        check_workflow_id(grandchild)


def test_a_default_child_id_cannot_be_squatted() -> None:
    """Starting ``victim-c1`` before ``victim`` starts its first child used to fail the parent."""
    env = WorkflowEnvironment(durable)
    with pytest.raises(InvalidWorkflowId, match="derived child id"):
        env.start(child, "squat", _workflow_id="victim-c1")
    h = env.start(parent, _workflow_id="victim")
    assert h.result(timeout=0) == "default"
    assert env.handle("victim-c1").result(timeout=0) == "default"


def test_an_outbox_lane_id_cannot_be_started_nor_purged() -> None:
    """``start(_workflow_id="fxq:<key>")`` ran in an effect lane's partition; ``purge`` then deleted
    the lane's pending effects with the execution."""
    env = WorkflowEnvironment(durable)
    effect_id = env.start(emitter, _workflow_id="reg-ids-emitter").result(timeout=0)
    assert [r["status"] for r in env.engine.outbox.rows("lane-a")] == ["pending"]  # waits for its retry
    with pytest.raises(InvalidWorkflowId, match="fxq:"):
        env.start(child, "x", _workflow_id="fxq:lane-a")
    env.clock.advance(60)
    Admin(env.engine).purge(0)
    row = env.engine.outbox.get(effect_id)
    assert row is not None and row["status"] == "pending", "purge deleted a pending effect"


@pytest.mark.parametrize("bad", ["fxq:k", "p-c1", "a\nb", "", 7], ids=repr)
def test_start_child_refuses_an_invalid_id_at_the_call(bad: Any) -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(bad_child, bad)
    out = h.result(timeout=0)  # settled at once: never a hang
    assert out.startswith("invalid: a child workflow id"), out
    assert env.store.scan_partitions("", 100) == [h.id]  # no child was created


def test_same_explicit_child_id_twice_with_other_input_fails_the_step_clearly() -> None:
    """The reproducer: the second start finds the first child (another input): a ChildWorkflowError."""
    env = WorkflowEnvironment(durable)
    h = env.start(twice, "first", "second", _workflow_id="reg-ids-twice")
    assert h.poll().done, f"parent is still {h.status()}"
    out = h.result(timeout=0)
    assert out.startswith("refused: ChildIdTaken:") and "other input" in out, out
    assert env.handle("reg-ids-fixed").result(timeout=0) == "first"


def test_same_explicit_child_id_twice_with_the_same_input_joins_the_child() -> None:
    """This parent's own child, same workflow and input: the second start resolves to it (DBOS-like)."""
    env = WorkflowEnvironment(durable)
    h = env.start(twice, "same", "same", _workflow_id="reg-ids-join")
    assert h.result(timeout=0) == "samesame"
    assert env.store.scan_partitions("", 100) == ["reg-ids-fixed", "reg-ids-join"]  # one child only


def test_joining_a_running_child_resolves_both_steps_when_it_ends() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(both, "reg-ids-shared", _workflow_id="reg-ids-both")
    assert h.status() == "running"
    assert env.signal("reg-ids-shared", "go", "!")
    env.run_until_idle()
    assert h.result(timeout=0) == "t!|t!"


def test_a_joined_step_whose_start_was_lost_is_joined_by_recovery() -> None:
    env = WorkflowEnvironment(durable)
    real = env.engine.children.start_child
    lost: list[ChildRequest] = []

    def flaky(req: ChildRequest) -> bool:
        if req.seq == 2 and not lost:  # the worker dies before carrying out the second start
            lost.append(req)
            return False
        return real(req)

    env.engine.children.start_child = flaky  # type: ignore[method-assign]
    h = env.start(both, "reg-ids-lost", _workflow_id="reg-ids-lost-parent")
    assert lost and h.status() == "running"
    for _ in range(3):  # what beat does: recovery scans
        env.clock.advance(600)
        env.engine.recovery.scan()
        env.run_until_idle()
    assert env.signal("reg-ids-lost", "go", "?")
    env.run_until_idle()
    assert h.result(timeout=0) == "t?|t?"


def test_a_squatted_explicit_child_id_still_fails_the_step() -> None:
    """Explicit ids can be taken by anyone: the holder is not this parent's child, so no join."""
    env = WorkflowEnvironment(durable)
    squatter = env.start(held, "t", _workflow_id="reg-ids-squat")
    h = env.start(both, "reg-ids-squat", _workflow_id="reg-ids-squat-parent")
    assert h.poll().done
    with pytest.raises(WorkflowFailedError, match="ChildIdTaken.*no parent"):
        h.result(timeout=0)
    assert squatter.status() == "running"
