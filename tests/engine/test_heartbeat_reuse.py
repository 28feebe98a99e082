"""Found by the adversarial review: the heartbeat after ``Durable.shutdown()``.

``worker_shutdown`` calls ``Durable.shutdown()`` (``glue/hook_receivers.py``), which stops the
engine's one heartbeat for good (``Heartbeat.stop`` sets ``_stopped``; ``Heartbeat.restart`` is
never called and ``wake()`` returns early once stopped). The engine object stays, so a worker
started again in the same process (``celery.contrib.testing.worker.start_worker`` twice in a
test session, an embedded worker restarted by an application) runs activities whose leases are
never renewed: after ``lease_ttl`` the recovery scan re-sends a step that is still running.
"""

from __future__ import annotations

import time

from celery import Celery

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.engine.documents.model import lease_live, marker_id


def test_leases_are_renewed_after_the_engine_was_shut_down_and_used_again() -> None:
    app = Celery("adv-heartbeat", set_as_current=False)
    durable = Durable(app, store="memory://", lease_ttl=0.6, heartbeat_interval=0.1)

    @durable.workflow(name="adv.hb.w")
    def w() -> int:
        return int(wf.now().timestamp())

    engine = durable.engine
    eid, _ = engine.start(w.definition, (), {}, workflow_id="adv-hb")
    # a step marker with a lease, as an activity's begin() makes it
    engine.store.create(
        {
            "pk": eid,
            "id": marker_id(1),
            "type": "step",
            "seq": 1,
            "kind": "activity",
            "name": "a",
            "input": {"args": [], "kwargs": {}},
            "attempts": 0,
        }
    )
    engine.cache.invalidate()

    durable.shutdown()  # a worker stopped (worker_shutdown) ...
    attempt, why = engine.activities.begin(eid, 1)  # ... and a worker of the same process runs a step
    assert attempt is not None, why
    first = engine.store.read(eid, marker_id(1))
    assert first is not None
    started = float(first["lease"]["expires"])
    try:
        # await renewals well past the first lease's end (the heartbeat beats every 0.1 s)
        deadline = time.monotonic() + 5.0
        while True:
            marker = engine.store.read(eid, marker_id(1))
            assert marker is not None
            assert lease_live(marker, time.time()), "the running attempt's lease lapsed: nobody renews it"
            if float(marker["lease"]["expires"]) > started + 1.2:  # two TTLs later, still held
                break
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.02)
    finally:
        engine.shutdown(release=True)
