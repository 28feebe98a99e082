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
