"""Issue 23 item 2: a re-run's ``emit`` (after reset, resume or retry) is a new effect; an explicit
``effect_id`` emitted again is reported not admitted (duplicate or conflict), never dropped silently."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, WorkflowCancelledError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("rerun-effects-tests", set_as_current=False)
durable = Durable(app, store="memory://")
RAN: list[Any] = []
FAIL: dict[str, bool] = {"flaky": True}


@durable.effect("rr.note", replay_safe=True)
def note(msg: Any) -> None:
    RAN.append(msg)


@durable_activity(name="rr.flaky")
def flaky() -> str:
    if FAIL["flaky"]:
        raise NonRetryableError("fails until fixed")
    return "ok"


@durable.workflow(name="rr.emitter")
def emitter() -> dict[str, str]:
    u = str(wf.uuid4())
    eid = durable.emit("rr.note", u)
    flaky()
    return {"sent": u, "effect_id": eid}


@durable.workflow(name="rr.explicit")
def explicit(same: bool) -> str:
    u = "fixed" if same else str(wf.uuid4())
    eid = durable.emit("rr.note", u, effect_id="rr-explicit-1")
    flaky()
    return eid


@durable.workflow(name="rr.saga")
def saga() -> str:
    try:
        flaky()
    except Exception:
        durable.emit("rr.note", "refund")  # the compensation
        raise
    durable.emit("rr.note", "ship")  # the same step number in the retried run
    return "shipped"


@durable.workflow(name="rr.order", signals={"go": str})
def order() -> str:
    try:
        wf.wait_signal("go")
    except WorkflowCancelledError:
        durable.emit("rr.note", "order cancelled")
        raise
    durable.emit("rr.note", "order confirmed")
    return "confirmed"


@pytest.fixture(autouse=True)
def _clean() -> None:
    RAN.clear()
    FAIL["flaky"] = True


def _settle(env: WorkflowEnvironment) -> None:
    env.run_until_idle()
    env.advance(300)  # beat's outbox scan admits left-over intents
    env.advance(300)


def _failed(env: WorkflowEnvironment, wf_fn: Any, *args: Any) -> Any:
    h = env.start(wf_fn, *args)
    env.run_until_idle()
    assert h.status() == "failed"
    return h


def test_reset_emit_is_a_new_effect() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env, emitter)
    assert len(RAN) == 1
    FAIL["flaky"] = False
    h.reset(step=1, reason="fixed flaky")
    out = env.result(h)
    _settle(env)
    assert out["sent"] in RAN and len(RAN) == 2, RAN
    assert out["effect_id"].endswith("~1")
    steps = {s.seq: s for s in Admin(env.engine).describe(h.id).steps}
    assert steps[2].state == "enqueued"


def test_retry_emit_at_a_forgotten_compensations_step_is_a_new_effect() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env, saga)
    _settle(env)
    assert RAN == ["refund"]
    FAIL["flaky"] = False
    Admin(env.engine).retry(h.id)
    assert env.result(h) == "shipped"
    _settle(env)
    assert RAN == ["refund", "ship"]


def test_reset_twice_each_rerun_emits_anew() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env, emitter)
    h.reset(step=1)
    env.run_until_idle()
    assert h.status() == "failed"
    FAIL["flaky"] = False
    h.reset(step=2)
    out = env.result(h)
    _settle(env)
    assert len(RAN) == 3 and RAN[-1] == out["sent"], RAN
    assert out["effect_id"].endswith("~2")


def test_resume_of_cancelled_execution_runs_the_resumed_runs_emit() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(order)
    env.cancel(h)
    assert h.status() == "cancelled"
    env.run_until_idle()
    Admin(env.engine).resume(h.id)
    env.run_until_idle()
    env.signal(h, "go", "now")
    assert env.result(h) == "confirmed"
    _settle(env)
    assert RAN == ["order cancelled", "order confirmed"]


@pytest.mark.parametrize(("same", "reason", "level"), [(True, "duplicate", "WARNING"), (False, "conflict", "ERROR")])
def test_explicit_effect_id_re_emitted_after_reset_is_told(
    same: bool, reason: str, level: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env, explicit, same)
    assert len(RAN) == 1
    FAIL["flaky"] = False
    h.reset(step=1)
    with caplog.at_level(logging.WARNING, logger="celery_durable"):
        assert env.result(h) == "rr-explicit-1"
        _settle(env)
    assert len(RAN) == 1  # once ever
    marker = next(d for d in env.store.query_partition(h.id).docs if d.get("kind") == "emit")
    assert marker["admitted"] is False and marker["reason"] == reason
    told = [r for r in caplog.records if "rr-explicit-1" in r.getMessage() and r.levelname == level]
    assert told, [(r.levelname, r.getMessage()) for r in caplog.records]
    emits = [s for s in Admin(env.engine).describe(h.id).steps if s.kind == "emit"]
    assert [s.state for s in emits] == [f"not enqueued ({reason})"]


def test_replay_of_a_kept_emit_keeps_its_id_and_first_run_ids_are_unchanged() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env, emitter)
    first = next(d for d in env.store.query_partition(h.id).docs if d.get("kind") == "emit")
    assert first["effect"]["id"] == f"{h.id}:000002"  # no suffix before any operation
    FAIL["flaky"] = False
    h.reset(step=3)  # the emit at step 2 is kept
    out = env.result(h)
    _settle(env)
    assert out["effect_id"] == f"{h.id}:000002" and len(RAN) == 1


def test_cli_show_says_whether_each_emit_was_enqueued() -> None:
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    from tests.apps import basic

    env = WorkflowEnvironment(durable)
    h = _failed(env, explicit, True)
    FAIL["flaky"] = False
    h.reset(step=1)
    env.result(h)
    _settle(env)
    basic.durable.configure(store=env.store)
    try:
        text = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "show", h.id])
        as_json = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "show", h.id, "--json"])
    finally:
        basic.durable.configure(store=None)
    assert text.exit_code == 0, text.output
    assert "not enqueued (duplicate)" in text.output, text.output
    steps = json.loads(as_json.output)["steps"]
    assert [s["state"] for s in steps if s["kind"] == "emit"] == ["not enqueued (duplicate)"]


REFUNDS: list[str] = []


@durable_activity(name="rr.refund_money")
def refund_money(order: str) -> str:
    REFUNDS.append(order)
    return f"refunded {order}"


@durable.workflow(name="rr.refund")
def refund(order: str) -> str:
    return refund_money(order)


@durable.workflow(name="rr.shop", signals={"go": str})
def shop(child_id: str | None) -> str:
    try:
        wf.wait_signal("go")
    except WorkflowCancelledError:
        refund.start_child("o1", _workflow_id=child_id).result()  # the compensation
        raise
    return "shipped"


@pytest.mark.parametrize("child_id", [None, "refund-o1"])
def test_resume_forgets_the_finished_children_of_forgotten_compensations(child_id: str | None) -> None:
    """A resumed run's compensation starts its own child (explicit id or derived), like retry's
    and reset's re-runs: the child of the forgotten compensation is not joined again."""
    REFUNDS.clear()
    env = WorkflowEnvironment(durable)
    h = env.start(shop, child_id)
    env.cancel(h)
    env.run_until_idle()
    assert h.status() == "cancelled" and REFUNDS == ["o1"]
    Admin(env.engine).resume(h.id)
    env.run_until_idle()
    env.cancel(h)
    env.run_until_idle()
    assert h.status() == "cancelled"
    assert REFUNDS == ["o1", "o1"]  # the second cancel's compensation ran too


def test_derived_ids_with_a_rerun_suffix_are_reserved_and_reachable() -> None:
    from celery_durable.engine.documents.checks import check_workflow_id
    from celery_durable.engine.documents.schema import child_execution_id, default_effect_id
    from celery_durable.errors import InvalidWorkflowId

    assert child_execution_id("p", 0, 2, 1) == "p-c2~1" and child_execution_id("p", 3, 2, 2) == "p-c2.r3~2"
    assert child_execution_id("p", 0, 2) == "p-c2"  # no operation: the historical id
    assert default_effect_id("p", 0, 7) == "p:000007" and default_effect_id("p", 2, 7, 3) == "p:2:000007~3"
    for taken in ("order-c2~1", "order-c2.r1~3"):  # a caller may not take a re-run's child id
        with pytest.raises(InvalidWorkflowId, match="derived child id"):
            check_workflow_id(taken)
    assert check_workflow_id("order-c2~1-c1", derived_ok=True) == "order-c2~1-c1"  # a signal target
    assert check_workflow_id("order~1") == "order~1"  # only a derived tail is reserved


def test_retry_sends_a_compensations_signal_step_anew() -> None:
    """signal_external's id carries the rerun count too: the retried run's send at the step of a
    forgotten compensation's send is a new signal, not a duplicate of the old one."""
    env = WorkflowEnvironment(durable)
    target = env.start(listener)
    h = _failed(env, signaller, target.id)
    FAIL["flaky"] = False
    Admin(env.engine).retry(h.id)
    assert env.result(h) == "sent"
    assert env.result(target) == ["refund", "ship"]


@durable.workflow(name="rr.listener", signals={"note": str})
def listener() -> list[str]:
    return [wf.wait_signal("note"), wf.wait_signal("note")]


@durable.workflow(name="rr.signaller")
def signaller(target: str) -> str:
    try:
        flaky()
    except Exception:
        wf.signal_external(target, "note", "refund")
        raise
    wf.signal_external(target, "note", "ship")
    return "sent"
