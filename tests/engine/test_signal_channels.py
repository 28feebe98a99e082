"""Signal channels (issue 13, item 3): ``wf.wait_any`` over several names, recorded as one
decision; ``wf.signal_external`` as an exactly-once step, deduplicated by the receiver."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, ExternalSignalError, WorkflowFailedError
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.dispatcher import SignalRequest
from celery_durable.engine.documents.schema import SIGNAL_KEY_PREFIX, SIGNAL_VALUE_PREFIX
from celery_durable.errors import DurableTimeoutError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("channel-tests", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="ch.any", signals={"a": int, "b": str, "c": int})
def pick(n: int) -> list[list[Any]]:
    got = [list(wf.wait_any("a", "b")) for _ in range(n)]
    got.append(["c", wf.wait_signal("c")])
    return got


@durable.workflow(name="ch.any_timeout", signals={"a": int, "b": int})
def pick_or_timeout() -> str:
    try:
        name, value = wf.wait_any("a", "b", timeout=timedelta(hours=1))
    except DurableTimeoutError:
        return "timeout"
    return f"{name}={value}"


@durable.workflow(name="ch.receiver", signals={"go": str})
def receiver() -> list[str]:
    return [wf.wait_signal("go"), wf.wait_signal("go")]


@durable.workflow(name="ch.sender")
def sender(target: str, name: str) -> str:
    try:
        wf.signal_external(target, name, "hello")
    except ExternalSignalError as exc:
        return f"failed: {exc.type_name}"
    return "sent"


def _values(env: WorkflowEnvironment, eid: str) -> list[Any]:
    docs = env.store.query_partition(eid).docs
    return [d for d in docs if d["id"].startswith(SIGNAL_VALUE_PREFIX)]


def test_wait_any_takes_values_in_arrival_order_across_names_and_leaves_the_others() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(pick, 2)
    env.signal(h, "c", 9)  # not waited for by wait_any: stays for the wait_signal
    env.signal(h, "b", "x")
    env.signal(h, "a", 1)
    env.signal(h, "a", 2)  # a third value: left unconsumed
    assert env.result(h) == [["b", "x"], ["a", 1], ["c", 9]]
    decisions = [d for d in env.store.query_partition(h.id).docs if d["id"].startswith("w:")]
    assert [(d["name"], d["value"]) for d in sorted(decisions, key=lambda d: d["id"])] == [
        ("b", "x"),
        ("a", 1),
        ("c", 9),
    ]


def test_wait_any_decision_is_replayed_not_recomputed() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(pick, 1)
    env.signal(h, "a", 1)
    # the first wait is decided (a=1): a later b must not change it on any replay
    env.signal(h, "b", "late")
    env.engine.drive(h.id)
    env.signal(h, "c", 3)
    assert env.result(h) == [["a", 1], ["c", 3]]


def test_wait_any_rejects_an_invalid_value_and_goes_on() -> None:
    env = WorkflowEnvironment(durable)
    rejected: list[str] = []
    env.engine.subscribe(lambda event, **kw: rejected.append(kw["name"]) if event == "signal_rejected" else None)
    h = env.start(pick, 1)
    # a value the receiver validates only where it is consumed (a workflow's send is JSON already)
    assert env.engine.signals.signal(h.id, "a", "not an int", signal_id="t-1")
    env.run_until_idle()
    env.signal(h, "b", "ok")
    env.signal(h, "c", 1)
    assert env.result(h) == [["b", "ok"], ["c", 1]]
    assert rejected == ["a"]


def test_wait_any_times_out_and_later_values_stay() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(pick_or_timeout)
    assert env.result(h) == "timeout"
    h2 = env.start(pick_or_timeout)
    env.advance(timedelta(minutes=30))
    env.signal(h2, "b", 7)
    assert env.result(h2) == "b=7"


def test_wait_any_refuses_undeclared_names() -> None:
    @durable.workflow(name="ch.undeclared", signals={"a": int})
    def undeclared() -> Any:
        return wf.wait_any("a", "zzz")

    env = WorkflowEnvironment(durable)
    h = env.start(undeclared)
    with pytest.raises(WorkflowFailedError, match="zzz"):
        env.result(h)


def test_signal_external_delivers_once_and_is_recorded_as_a_step() -> None:
    env = WorkflowEnvironment(durable)
    r = env.start(receiver, _workflow_id="recv-1")
    s = env.start(sender, "recv-1", "go")
    assert env.result(s) == "sent"
    (value,) = _values(env, "recv-1")
    assert value["value"] == "hello" and value["sender"]["pk"] == s.id
    keys = [d for d in env.store.query_partition("recv-1").docs if d["id"].startswith(SIGNAL_KEY_PREFIX)]
    assert len(keys) == 1
    steps = env.engine.store.query_partition(s.id).docs
    marker = next(d for d in steps if d.get("kind") == "signal_send")
    assert marker["target"] == "recv-1" and marker.get("due_kind") is None  # settled with its outcome
    # a retried send (a crash after the value was recorded, before the sender's outcome) is deduped
    req = SignalRequest(s.id, int(marker["seq"]), 0, "recv-1", "go", "hello", str(marker["signal_id"]))
    assert env.engine.signals.signal("recv-1", "go", "hello", signal_id=req.signal_id) is True
    env.run_until_idle()
    assert len(_values(env, "recv-1")) == 1
    env.signal(r, "go", "second")
    assert env.result(r) == ["hello", "second"]


def test_signal_external_send_lost_before_the_outcome_is_resent_by_recovery_once() -> None:
    env = WorkflowEnvironment(durable)
    env.start(receiver, _workflow_id="recv-2")
    # lose every send the drive carries out: as if the process died right after the commit
    original = env.engine.signals.send_signal
    env.engine.signals.send_signal = lambda req: None  # type: ignore[method-assign]
    s = env.start(sender, "recv-2", "go")
    assert s.status() == "running" and _values(env, "recv-2") == []
    env.engine.signals.send_signal = original  # type: ignore[method-assign]
    env.clock.advance(env.engine.settings.activity_queue_timeout + 1)
    env.engine.recovery.scan()
    env.run_until_idle()
    env.engine.recovery.scan()  # a second scan finds the step settled: nothing more is sent
    env.run_until_idle()
    assert s.result(timeout=0) == "sent"
    assert len(_values(env, "recv-2")) == 1


def test_signal_external_fails_the_step_clearly() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(sender, "nobody", "go")) == "failed: UnknownWorkflowError"
    env.start(receiver, _workflow_id="recv-3")
    assert env.result(env.start(sender, "recv-3", "undeclared")) == "failed: PayloadValidationError"
    assert _values(env, "recv-3") == []


def test_signal_external_shows_in_describe() -> None:
    env = WorkflowEnvironment(durable)
    env.start(receiver, _workflow_id="recv-4")
    s = env.start(sender, "recv-4", "go")
    (rec,) = Admin(env.engine).describe(s.id).steps
    assert (rec.kind, rec.name, rec.state, rec.child_id) == ("signal_send", "go", "ok", "recv-4")
