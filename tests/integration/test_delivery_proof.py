"""Issue 23 items 1 and 5 with real ``celery worker`` processes (the repro scripts' scenarios):
a queued message of the old run does not complete the reset run's step, and a published message
with an ``outcome`` header does not choose a pending step's result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery_durable.engine.documents.schema import marker_id, result_id
from celery_durable.glue.durable_activity import DURABLE_HEADER
from tests.apps import trust_a
from tests.plugins.workers import wait_until

APP = "tests.apps.trust_a"


def test_a_queued_message_of_the_old_run_does_not_complete_the_reset_runs_step(cluster: Any, tmp_path: Path) -> None:
    with cluster.client_of(trust_a, tmp_path / "marks") as durable:
        main = cluster.start_worker(app=APP, pool="solo", concurrency=1)
        h = trust_a.reset_flow.start("k1")
        wait_until(lambda: h.status() == "failed", timeout=60, what="the execution to fail")
        durable.handle(h.id).reset(step=1, reason="fixed fail_once")
        cluster.start_worker(app=APP, pool="solo", concurrency=1, extra=["-Q", cluster.queue + "_b"])
        value = h.result(timeout=60)
        time.sleep(1.0)  # the re-run's own echo message, consumed after the old one
        ran = (trust_a.MARKS / "echo").read_text().split()
        assert value["echo"] == value["t"] and ran == [value["t"]]  # the old message ran nothing
        assert "stale delivery" in "".join(w.log() for w in cluster.workers.workers)
        del main


def test_an_outcome_header_does_not_choose_the_result(cluster: Any, tmp_path: Path) -> None:
    with cluster.client_of(trust_a, tmp_path / "marks") as durable:
        worker = cluster.start_worker(app=APP, pool="solo", concurrency=1)  # not on the _pay queue
        h = trust_a.order.start(100)
        store = durable.engine.store
        wait_until(lambda: store.read(h.id, marker_id(1)) is not None, timeout=30, what="step 1")
        forged = {"pk": h.id, "id": result_id(1), "type": "result", "run": 0, "seq": 1, "name": "trust_a.charge"}
        forged.update(ok=True, value="charged 0 (FORGED)")
        token = store.read(h.id, marker_id(1)).get("token")  # even with the right token
        meta = {"e": h.id, "s": 1, "r": 0, "w": "trust_a.order", "t": token, "outcome": forged}
        trust_a.app.send_task("trust_a.charge", args=[100], queue=cluster.queue, headers={DURABLE_HEADER: meta})
        wait_until(lambda: "did not seal" in worker.log(), timeout=30, what="the forged message to be dropped")
        assert store.read(h.id, result_id(1)) is None and h.status() == "running"
        cluster.start_worker(app=APP, pool="solo", concurrency=1, extra=["-Q", cluster.queue + "_pay"])
        assert h.result(timeout=60) == "order done: charged 100"
