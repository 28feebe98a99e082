"""Pausing an execution (issue 27 §2, engine/admin/pause.py): while paused nothing of it is
replayed — an activity outcome, a fired timer, a signal are recorded but take no new step and send
no activity — and no recovery drive is sent for it; unpausing drives it and it goes on from what
was recorded; both are recorded operations; an ended execution cannot be paused; terminate works
on a paused one and a cancel waits for the unpause."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.admin.terminate import terminate
from celery_durable.errors import OperationRefused
from tests.engine.inprocess import InProcess

RAN: list[str] = []


def _world() -> tuple[InProcess, Any]:
    w = InProcess()
    RAN.clear()

    @w.activity
    def step(name: str) -> str:
        RAN.append(name)
        return name

    def job(n: int) -> list[str]:
        out = [step("one")]
        wf.sleep(60)
        out.append(step("two"))
        out.append(str(wf.wait_signal("go")))
        out.append(step("three"))
        return out

    return w, w.registry.add_workflow("job", job)


def _activities(w: InProcess) -> list[Any]:
    return [item for kind, item in w.dispatcher.queue if kind == "activity"]


def test_paused_nothing_new_runs_what_arrives_is_recorded_and_unpause_goes_on() -> None:
    w, d = _world()
    w.engine.start(d, (1,), {}, workflow_id="p1")
    w.run()
    assert RAN == ["one"]  # then sleeping 60 s
    assert pause(w.engine, "p1", "ops", "investigating")
    assert not pause(w.engine, "p1", "ops")  # paused already
    assert w.ex("p1")["paused"] is True and not w.ex("p1").get("due_kind")
    w.clock.advance(61)  # type: ignore[attr-defined]
    w.engine.timers.fire_due_clocks()  # the timer fires: recorded, no step taken
    w.run()
    w.engine.signal("p1", "go", "sig")  # a signal: recorded
    w.run()
    assert RAN == ["one"] and w.status("p1") == "running"
    steps = w.ex("p1").get("steps")
    w.clock.advance(3600)  # type: ignore[attr-defined]
    w.engine.recovery.scan()  # beat's scans: nothing to send for a paused execution
    assert not w.dispatcher.queue
    assert w.ex("p1").get("steps") == steps
    assert unpause(w.engine, "p1", "ops")
    w.run()
    assert w.status("p1") == "completed"
    assert w.ex("p1")["result"] == ["one", "two", "sig", "three"] and RAN == ["one", "two", "three"]
    ops = sorted((d["action"], d["by"]) for d in w.store.query_partition("p1").docs if d.get("type") == "operation")
    assert ops == [("pause", "ops"), ("unpause", "ops")]


def test_an_activity_running_when_paused_finishes_but_the_next_waits() -> None:
    w, d = _world()
    w.engine.start(d, (1,), {}, workflow_id="p2")
    (kind, first_drive) = w.dispatcher.queue.popleft()
    w.engine.drive(first_drive)  # step one is sent, not run yet
    (req,) = _activities(w)
    w.dispatcher.queue.clear()
    attempt, _ = w.engine.activities.begin(req.execution_id, req.seq, req.run)
    assert attempt is not None
    pause(w.engine, "p2", "ops")
    w.engine.activities.complete(attempt, w.engine.activities.result_doc(attempt, value="one"))
    w.run()
    docs = {x["id"]: x for x in w.store.query_partition("p2").docs}
    assert any(x.get("type") == "result" and x.get("seq") == req.seq for x in docs.values())  # recorded
    assert w.ex("p2").get("steps") == 1  # the sleep after it not taken yet
    unpause(w.engine, "p2", "ops")
    w.run()
    assert w.ex("p2").get("steps", 0) >= 2


def test_an_ended_execution_cannot_be_paused_and_unpause_of_a_running_one_is_false() -> None:
    w, d = _world()
    w.engine.start(d, (1,), {}, workflow_id="p3")
    w.run()
    assert not unpause(w.engine, "p3", "ops")
    terminate(w.engine, "p3", "ops", None)
    with pytest.raises(OperationRefused, match="ended"):
        pause(w.engine, "p3", "ops")


def test_terminate_ends_a_paused_execution_and_a_cancel_waits_for_the_unpause() -> None:
    w, d = _world()
    w.engine.start(d, (1,), {}, workflow_id="p4")
    w.engine.start(d, (1,), {}, workflow_id="p5")
    w.run()
    pause(w.engine, "p4", "ops")
    pause(w.engine, "p5", "ops")
    assert terminate(w.engine, "p4", "ops", None) and w.status("p4") == "failed"
    assert w.engine.cancel("p5")
    w.run()
    assert w.status("p5") == "running" and w.ex("p5")["cancel_requested"]
    unpause(w.engine, "p5", "ops")
    w.run()
    assert w.status("p5") == "cancelled"
