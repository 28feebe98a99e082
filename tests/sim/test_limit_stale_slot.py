"""Package bug found by the simulation (invariant 13 (a), seed 523): a delivery of a limited step
takes its slot in ``ActivityRunner.begin`` for attempt ``n`` (``Slots.enter``), then loses its
lease write to a duplicate delivery of the same message, which begins attempt ``n`` (the slot is
that attempt's too), fails it and gives the slot back on its retry (``retrying`` → ``leave``),
granting it to the next waiter. The first delivery's ``begin`` loops on the etag conflict, reads
the marker again and begins attempt ``n + 1`` — reusing the slot it took for attempt ``n``
(``slot is not None``: no ``enter``), a slot already given back. Attempt ``n + 1`` runs without
a slot: ``max_running + 1`` attempts of the key at once.

Pause was not involved (no execution of that seed's key was paused then)."""

from __future__ import annotations

from celery_durable.engine.documents.model import lease_live, marker_id
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from tests.sim.limit_worlds import one_slot_two_steps


def test_a_begin_looping_past_a_duplicates_ended_attempt_takes_a_slot_for_its_own() -> None:
    w, store, lpk = one_slot_two_steps("ss.one")
    runner = w.engine.activities

    def meanwhile() -> None:
        """Delivery B of the same message begins attempt 1, which fails: its retry gives the
        lease and the slot back, and the slot goes to e2's waiting step."""
        attempt, why = runner.begin("e1", 1, 0)
        assert attempt is not None and attempt.number == 1, why
        runner.retrying(attempt, 5.0, RuntimeError("fails once"))
        after = store.read(lpk, LIMIT_DOC_ID)
        assert after is not None and list(after["holders"]) == ["e2|0|1"]

    store.hook = meanwhile
    # delivery A: took attempt 1's slot, loses its lease write to B, reads again and finds attempt 2
    second, why = runner.begin("e1", 1, 0)
    granted = [item for kind, item in w.dispatcher.queue if kind == "activity" and item.execution_id == "e2"]
    assert granted, "e2's step was sent its slot"
    other, _ = runner.begin("e2", 1, 0)
    assert other is not None  # e2's step holds the one slot and runs
    doc = store.read(lpk, LIMIT_DOC_ID)
    assert doc is not None
    if second is not None:
        marker = store.read("e1", marker_id(1, 0))
        assert marker is not None and lease_live(marker, w.clock.now())
        assert "e1|0|1" in doc["holders"], (
            f"e1's attempt {second.number} began without a slot (holders {sorted(doc['holders'])}): "
            "2 attempts run under max_running=1"
        )
    else:
        assert why.startswith("waiting for a slot of limit"), why
        assert [x["s"] for x in doc["waiters"]] == ["e1|0|1"]  # queued, sent again when granted
    assert list(doc["holders"]) == ["e2|0|1"]
