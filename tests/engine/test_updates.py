"""Workflow updates (issue 27 §4, engine/replay/updates.py, engine/signals/updates.py): a request
into a running workflow, validated, applied once at a wait point and recorded as a step only
when accepted, answered to the caller after the workflow handled it; replays rebuild the state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_durable import (
    Durable,
    UnknownWorkflowError,
    UpdateFailedError,
    UpdateRefusedError,
    UpdateRejectedError,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.engine.documents.update_docs import update_outcome_id
from celery_durable.engine.replay.check import check_history
from celery_durable.stores.base import Op
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("update-tests", set_as_current=False), store="memory://")


@durable_activity(name="upd.double")
def double(n: int) -> int:
    return 2 * n


def check_item(item: str, qty: int = 1) -> None:
    if qty < 1:
        raise ValueError(f"qty must be >= 1, not {qty}")


@durable.workflow(name="upd.cart")
def cart(owner: str) -> dict[str, Any]:
    items: list[str] = []

    @wf.update("add", validator=check_item)
    def add(item: str, qty: int = 1) -> int:
        items.extend([item] * qty)
        return len(items)

    def boom() -> None:
        items.append("half")
        raise KeyError("boom")

    wf.set_update_handler("boom", boom)
    wf.set_update_handler("steps", lambda: double(1))  # a durable call: refused
    wf.query("items")(lambda: list(items))
    doubled = double(len(owner))  # a wait point where updates are applied too
    wf.wait_signal("checkout")
    return {"items": items, "doubled": doubled}


def steps_of(env: WorkflowEnvironment, eid: str) -> list[tuple[str, str]]:
    docs = sorted(
        (d for d in env.store.query_partition(eid).docs if d.get("type") == "step"), key=lambda d: int(d["seq"])
    )
    return [(str(d["kind"]), str(d["name"])) for d in docs]


def test_an_accepted_update_answers_after_the_workflow_applied_it_and_replays_rebuild_the_state() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "ann", _workflow_id="cart-1")
    assert env.update(h, "add", "apple") == 1
    assert env.update(h, "add", "pear", 2) == 3
    assert h.query("items") == ["apple", "pear", "pear"]  # a full read-only replay re-applies both
    assert steps_of(env, "cart-1") == [("activity", "upd.double"), ("signal", "checkout")] + [("update", "add")] * 2
    env.signal(h, "checkout", True)
    assert h.result() == {"items": ["apple", "pear", "pear"], "doubled": 6}


def test_a_rejected_update_leaves_no_step_and_the_caller_learns_why() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "bo", _workflow_id="cart-2")
    before = steps_of(env, "cart-2")
    with pytest.raises(UpdateRejectedError, match="qty must be >= 1"):
        env.update(h, "add", "apple", 0)  # its validator
    with pytest.raises(UpdateRejectedError, match="PayloadValidationError"):
        env.update(h, "add", {"not": "a str"})  # its arguments, against the handler's hints
    with pytest.raises(UpdateRejectedError, match="no update handler 'nope'.*registered: 'add', 'boom', 'steps'"):
        env.update(h, "nope")
    assert steps_of(env, "cart-2") == before  # nothing entered the history
    assert env.update(h, "add", "fig") == 1 and h.query("items") == ["fig"]


def test_a_failing_handler_is_recorded_and_its_error_raised_in_the_caller() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "cy", _workflow_id="cart-3")
    with pytest.raises(UpdateFailedError, match="KeyError"):
        env.update(h, "boom")
    with pytest.raises(UpdateFailedError, match="cannot make a durable call"):
        env.update(h, "steps")
    assert steps_of(env, "cart-3")[-2:] == [("update", "boom"), ("update", "steps")]
    assert h.query("items") == ["half"]  # what the failed handler changed stays changed, replayed
    env.signal(h, "checkout", True)
    assert h.result()["items"] == ["half"]


def test_updates_to_an_ended_or_missing_execution_fail_at_once() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "di", _workflow_id="cart-4")
    env.signal(h, "checkout", True)
    with pytest.raises(UpdateRefusedError, match="has ended"):
        h.update("add", "x")
    with pytest.raises(UnknownWorkflowError):
        env.handle("cart-none").update("add", "x")


def test_a_resent_request_with_its_update_id_is_applied_once() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "ed", _workflow_id="cart-5")
    assert env.update(h, "add", "a", update_id="u-1") == 1
    assert env.update(h, "add", "a", update_id="u-1") == 1  # the first request's answer
    env.engine.dispatcher.send_drive("cart-5")  # a duplicate drive decides nothing again
    env.run_until_idle()
    assert h.query("items") == ["a"] and steps_of(env, "cart-5").count(("update", "add")) == 1


@durable.workflow(name="upd.rolling")
def rolling(n: int) -> list[str]:
    seen: list[str] = []
    wf.set_update_handler("note", lambda text: seen.append(f"{n}:{text}") or len(seen))
    if n == 0:
        wf.continue_as_new(1)  # no wait point in run 0: a request recorded before goes to run 1
    wf.wait_signal("stop")
    return seen


@durable.workflow(name="upd.quick")
def quick() -> int:
    wf.set_update_handler("note", lambda: 1)
    return 1  # never waits: an update sent before it ran is refused when it ends


def test_an_update_racing_continue_as_new_goes_to_the_new_run_and_one_racing_the_end_is_refused() -> None:
    env = WorkflowEnvironment(durable)
    eid, _ = env.engine.start(rolling.definition, (0,), {}, workflow_id="roll-1")
    n = env.engine.updates.send(eid, "note", ("hi",))  # recorded before the first drive
    env.run_until_idle()
    assert env.engine.updates.outcome(eid, n, timeout=0) == 1
    assert env.engine.store.read(eid, update_outcome_id(n))["run"] == 1  # type: ignore[index]
    env.signal(eid, "stop", True)
    assert env.handle(eid).result() == ["1:hi"]
    qid, _ = env.engine.start(quick.definition, (), {}, workflow_id="quick-1")
    n = env.engine.updates.send(qid, "note")
    env.run_until_idle()
    with pytest.raises(UpdateRefusedError, match="ended \\(completed\\) before it handled"):
        env.engine.updates.outcome(qid, n, timeout=0)


@durable.workflow(name="upd.sequence")
def sequence() -> list[Any]:
    log: list[Any] = []
    wf.set_update_handler("mark", lambda tag: log.append(tag))
    wf.set_query_handler("log", lambda: list(log))
    for i in range(3):
        log.append(double(i))  # updates land before the value of the step they waited on
    wf.wait_signal("stop")
    return log


def test_a_replay_applies_each_update_at_the_point_it_was_applied() -> None:
    env = WorkflowEnvironment(durable)
    eid, _ = env.engine.start(sequence.definition, (), {}, workflow_id="seq-1")
    env.engine.updates.send(eid, "mark", ("a",))
    env.run_until_idle()
    env.update(eid, "mark", "b")
    h = env.handle(eid)
    env.signal(h, "stop", True)
    expected = h.result()
    # "a" was applied at the first wait point (before step 1's value), "b" where it waited for the signal
    assert expected == ["a", 0, 2, 4, "b"]
    assert h.query("log") == expected  # a full read-only replay of the ended history rebuilds it
    docs = {d["id"]: d for d in env.store.query_partition(eid).docs}
    assert check_history(docs, durable.registry, durable.settings, env.clock.now()).ok


def test_a_malformed_request_fails_its_execution_with_a_clear_error() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "fy", _workflow_id="cart-6")
    ex = env.store.read("cart-6", "exec")
    assert ex is not None
    bumped = {k: v for k, v in ex.items() if not k.startswith("_")} | {"update_seq": 1}
    bad = {"pk": "cart-6", "id": "upd:000001", "type": "update_request", "n": "one", "name": "add", "input": {}}
    env.store.batch("cart-6", [Op.create(bad), Op.replace(bumped, if_match=ex["_etag"])])
    env.engine.dispatcher.send_drive("cart-6")
    env.run_until_idle()
    assert h.status() == "failed"
    error = env.engine.read_exec("cart-6")["error"]
    assert error is not None and "upd:000001" in error["message"] and "'n'" in error["message"]


def test_a_reset_before_updates_decides_their_requests_again() -> None:
    """A reset forgets what the run recorded after its step, updates and rejections included: their
    requests are pending again and the re-run decides them, so its state has them."""
    env = WorkflowEnvironment(durable)
    h = env.start(cart, "gi", _workflow_id="cart-7")
    assert env.update(h, "add", "apple") == 1
    with pytest.raises(UpdateRejectedError):
        env.update(h, "add", "x", 0)
    env.cancel(h)
    assert h.status() == "cancelled" and h.query("items") == ["apple"]
    h.reset(step=1)
    env.run_until_idle()
    assert h.status() == "running" and h.query("items") == ["apple"]  # decided again, once
    assert steps_of(env, "cart-7").count(("update", "add")) == 1
    with pytest.raises(UpdateRejectedError):
        env.engine.updates.outcome("cart-7", 2, timeout=0)  # rejected again
    env.signal(h, "checkout", True)
    assert h.result()["items"] == ["apple"]


class Receipt(BaseModel):
    at: datetime
    items: int


def test_an_answer_is_decoded_as_the_callers_result_type() -> None:
    """The answer travels as JSON (a datetime as its ISO text, a model as a dict): ``result_type``
    gives the caller the value the handler returned, not its JSON form silently."""
    t = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)

    @durable.workflow(name="upd.receipts")
    def receipts() -> None:
        count = 0

        @wf.update("buy")
        def buy() -> Receipt:
            nonlocal count
            count += 1
            return Receipt(at=t, items=count)

        wf.wait_signal("done")

    env = WorkflowEnvironment(durable)
    h = env.start(receipts)
    raw = env.update(h, "buy")
    assert raw == {"at": "2026-12-05T09:30:00Z", "items": 1}
    assert env.update(h, "buy", result_type=Receipt) == Receipt(at=t, items=2)
