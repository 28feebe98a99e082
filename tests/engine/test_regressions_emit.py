"""Found by the adversarial review: ``wf.emit`` admission by the engine (``engine/core.py`` ``_admit``)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from pydantic import BaseModel

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-emit", set_as_current=False)
durable = Durable(app, store="memory://")
SENT: list[str] = []


class Note(BaseModel):
    text: str


@durable.effect("adv.emit.note")
def note(msg: Note) -> None:
    SENT.append(msg.text)


@durable.workflow(name="adv.emit.loop")
def loop(n: int) -> int:
    wf.emit("adv.emit.note", Note(text=f"tick {n}"))  # emit, then continue in the same drive
    if n == 0:
        return 0
    wf.continue_as_new(n - 1)
    return -1


def test_effect_emitted_right_before_continue_as_new_is_not_lost() -> None:
    """README: "emit: exactly once, even replayed". An effect recorded by the drive that also
    continues as new must still run (the old run's intent must not be pruned before admission)."""
    SENT.clear()
    env = WorkflowEnvironment(durable)
    h = env.start(loop, 2, _workflow_id="adv-emit-loop")
    assert env.result(h) == 0
    # what beat's outbox scan would do much later: admit any intent left behind
    env.advance(timedelta(minutes=10))
    env.advance(timedelta(minutes=10))
    assert sorted(SENT) == ["tick 0", "tick 1", "tick 2"]


full_app = Celery("adv-emit-full", set_as_current=False)
full_app.conf.durable_outbox_max_lane_backlog = 1
full = Durable(full_app, store="memory://")
FULL_SENT: list[str] = []


@full.effect("adv.emit.full.note", max_attempts=1)
def full_note(msg: Note) -> None:
    FULL_SENT.append(msg.text)


@full.workflow(name="adv.emit.full")
def emit_shared() -> str:
    wf.emit("adv.emit.full.note", Note(text="from the workflow"), key="shared")
    return "done"


def test_emit_into_a_full_lane_waits_and_never_stops_the_scan() -> None:
    """Issue 11 B1/r15: an emit whose lane is full leaves its intent due (later), every outbox scan
    still serves the other lanes, and the effect gets in once the lane has room."""
    FULL_SENT.clear()
    env = WorkflowEnvironment(full)
    outbox = env.engine.outbox
    blocker = outbox.effect_body(
        "adv.emit.full.note",
        {"text": "blocker"},
        key="shared",
        effect_id="blocker",
        available_at=env.clock.now() + 3600,
        replay_safe=True,
        max_attempts=1,
    )
    outbox.admit(blocker)  # the lane is full (limit 1) and its row waits an hour
    h = env.start(emit_shared, _workflow_id="adv-emit-full")
    assert env.result(h) == "done"
    env.advance(timedelta(minutes=10))  # the scan finds the intent due: deferred, no error
    report = outbox.scan()
    assert report.errors == 0
    assert [r["effect_id"] for r in outbox.rows("shared")] == ["blocker"] and FULL_SENT == []
    outbox.cancel("blocker")
    env.advance(timedelta(minutes=10))
    env.advance(timedelta(minutes=10))
    assert FULL_SENT == ["from the workflow"]
