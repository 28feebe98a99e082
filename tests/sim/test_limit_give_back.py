"""Package bug found by the simulation (invariant 13 (a'), a seed-907 schedule): a delivery that
lost the race for a step's lease to a duplicate delivery of the same attempt, then found the run
ended (cancelled), gives back "its" slot (``ActivityAttempts._give_back``): the slot is keyed by
(attempt number, marker token), which both deliveries share, so it frees the slot the *running*
attempt holds and grants it to the next waiter: two attempts run under ``max_running=1``.

The engine's own rule (``Slots._check_expired``) is that an attempt still holding its step lease
keeps its slot even after its execution ended, until it stops. Expected to fail until fixed."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.engine.documents.model import lease_live, marker_id
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from tests.sim.limit_worlds import one_slot_two_steps


def test_a_losing_duplicate_delivery_does_not_free_the_running_attempts_slot() -> None:
    w, store, lpk = one_slot_two_steps("gb.one")
    begin = w.engine.activities.begin
    running: list[Any] = []

    def meanwhile() -> None:
        """Delivery B of the same message begins (attempt 1 runs), then e1 is cancelled and its
        drive ends the run while B still runs."""
        attempt, why = begin("e1", 1, 0)
        assert attempt is not None, why
        running.append(attempt)
        assert w.engine.cancel("e1")
        w.engine.drive("e1")
        assert w.status("e1") == "cancelled"

    store.hook = meanwhile
    lost, why = begin("e1", 1, 0)  # delivery A: took "its" slot, loses the lease write, finds the run ended
    assert lost is None, why
    marker = store.read("e1", marker_id(1, 0))
    assert marker is not None and lease_live(marker, w.clock.now())  # B's attempt still runs
    doc = store.read(lpk, LIMIT_DOC_ID)
    assert doc is not None
    if "e1|0|1" not in doc["holders"]:
        granted = [kind for kind, item in w.dispatcher.queue if kind == "activity" and item.execution_id == "e2"]
        second, _ = begin("e2", 1, 0) if granted else (None, "")
        pytest.fail(
            "delivery A freed the slot of B's running attempt 1 (holders now "
            f"{sorted(doc['holders'])}); e2's step {'began too: 2 attempts run' if second else 'was granted'} "
            "under max_running=1"
        )
