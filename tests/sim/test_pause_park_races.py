"""Parking (engine/admin/pause.py ``park``) stranded a paused execution's lost activity (fixed:
a document already parked or not due is left alone, and a park is written with the exec's etag).

Found by the simulation (harness/sim_pause.py, ``python -m tests.sim.run --seed N``): of
``bench/sim.py --seeds 1000``, seeds 82, 225, 334, 362, 460, 582, 628, 652, 775, 782, 978, 992 (a
marker parked twice) and 246 (a park landing after the unpause) leave an execution running with
nothing due (invariant 5).

1. Parked twice: a recovery scan parks a paused execution's lost activity step (``parked =
   [due_kind, due_at]``, due cleared); a second scan whose ``scan_due`` listing predates that write
   (another worker's beat; in the simulation, a scan preempted inside the first one's store calls)
   reads the parked marker and parks it again: ``parked`` becomes ``[None, None]``. The unpause
   re-arms that — nothing due — and the lost attempt is never sent again.
2. Parked after the unpause: the scan reads the exec paused, the unpause commits (re-arming what
   was parked then: not this step), then the scan's park lands — its write is guarded by the
   marker's etag only, not the exec's. The execution is running, not paused, and the step's due is
   parked for good.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from celery_durable.engine.admin import pause as pause_mod
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.drive import recovery as recovery_mod
from celery_durable.stores.memory import MemoryStore
from tests.engine.inprocess import InProcess


def test_parking_a_parked_step_again_keeps_its_due() -> None:
    store = MemoryStore()
    store.create({"pk": "e1", "id": "s:000001", "type": "step", "due_kind": "activity", "due_at": 48.9})
    store.create({"pk": "e1", "id": "exec", "type": "exec", "paused": True})
    engine = types.SimpleNamespace(store=store)
    pause_mod.park(engine, store.read("e1", "s:000001") or {}, store.read("e1", "exec") or {})  # the first scan
    # a scan that listed it before that park (it reads the marker after it, the exec as it is now)
    pause_mod.park(engine, store.read("e1", "s:000001") or {}, store.read("e1", "exec") or {})
    assert (store.read("e1", "s:000001") or {}).get("parked") == ["activity", 48.9]


def _lost_activity() -> InProcess:
    """``job`` (one activity) started, its activity message lost, the execution paused."""
    w = InProcess()

    @w.activity
    def step() -> str:
        return "ok"

    def job() -> str:
        return str(step())

    w.engine.start(w.workflow(job), (), {}, workflow_id="j1")
    q = w.dispatcher.queue
    while q:  # run the drives, drop the activity message (a worker killed before it began)
        kind, item = q.popleft()
        if kind != "activity":
            q.appendleft((kind, item))
            w.dispatcher.run_some(1)
    pause(w.engine, "j1", "ops")
    return w


def _beat(w: InProcess, seconds: float, rounds: int) -> None:
    for _ in range(rounds):
        w.clock.advance(seconds)  # type: ignore[attr-defined]
        w.engine.timers.fire_due_clocks()
        w.engine.recovery.scan()
        w.run()


def test_a_lost_activity_parked_while_paused_runs_once_unpaused() -> None:
    w = _lost_activity()
    _beat(w, 100, rounds=2)  # parked
    unpause(w.engine, "j1", "ops")
    w.run()
    _beat(w, 100, rounds=3)
    assert w.status("j1") == "completed"


def test_a_park_landing_after_the_unpause_does_not_strand_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _lost_activity()
    real = pause_mod.park
    raced: list[str] = []

    def late(engine: Any, doc: Any, ex: Any) -> None:  # the scan read it paused; the unpause commits first
        if not raced:
            raced.append(str(doc["id"]))
            assert unpause(w.engine, "j1", "ops")
        real(engine, doc, ex)

    monkeypatch.setattr(recovery_mod, "park", late)
    for _ in range(5):
        if not raced:
            _beat(w, 100, rounds=1)
    assert raced == ["s:000001"]
    monkeypatch.setattr(recovery_mod, "park", real)
    w.run()
    _beat(w, 100, rounds=4)
    docs = {d["id"]: d for d in w.engine.store.query_partition("j1").docs}
    assert not docs["exec"].get("paused")
    assert w.status("j1") == "completed", docs["s:000001"]
