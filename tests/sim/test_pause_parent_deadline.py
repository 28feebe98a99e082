"""A parent paused past its deadline ends failed (ChildWorkflowError), not timed out. Fails today.

Found by the simulation (harness/sim_pause.py): seed 747 of ``bench/sim.py`` (and seed 327 with
the pauses planned before the batch was added: a ``w_parent`` with ``timeout=40`` paused at t=8,
unpaused at t=183). Unpaused, a parent's deadline goes first (``deadlines._parent_first``): the
parent is marked timed out, its child cancelled, it ends ``timed_out``. Paused, the parent's
deadline clock is parked, while its child's (capped by the parent's: the same instant) fires:
the child ends ``timed_out`` and its end is recorded in the paused parent. The unpause delivers
the parent's passed deadline (``fire_exec_clock``), but the replay meets the child's failure
first: ``ChildWorkflowError`` escapes the workflow and the parent ends ``failed`` (marked
``timed_out`` all the same) — an outcome no run without the pause has.
"""

from __future__ import annotations

from celery_durable import workflow as wf
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.starts.deadlines import Timing
from tests.engine.inprocess import InProcess


def _beat(w: InProcess, seconds: float, rounds: int) -> None:
    for _ in range(rounds):
        w.clock.advance(seconds)  # type: ignore[attr-defined]
        w.engine.timers.fire_due_clocks()
        w.engine.recovery.scan()
        w.run()


def _world() -> InProcess:
    w = InProcess()

    def kid() -> str:
        wf.sleep(3600)
        return "kid"

    kd = w.workflow(kid)

    def par() -> str:
        return str(require_context("parent").start_child(kd, (), {}, "kid-1").result())

    w.engine.start(w.workflow(par), (), {}, workflow_id="par", timing=Timing(timeout=120))
    w.run()
    return w


def test_unpaused_parent_past_its_deadline_times_out() -> None:
    w = _world()
    _beat(w, 51, rounds=6)
    assert w.status("par") == "timed_out"


def test_parent_paused_past_its_deadline_times_out_when_unpaused() -> None:
    w = _world()
    pause(w.engine, "par", "ops")
    _beat(w, 51, rounds=6)  # past the deadline (120 s): the child's clock fires, the parent's is parked
    unpause(w.engine, "par", "ops")
    w.run()
    _beat(w, 51, rounds=3)
    assert w.status("par") == "timed_out", (w.status("par"), w.status("kid-1"))
