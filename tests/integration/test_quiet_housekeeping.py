"""An idle worker and beat on the defaults send (almost) no library messages (issue 25).

The timer, outbox and recovery scans were beat entries: 76 messages a minute on an idle system
(152 worker log lines), through the activity queue, where a scan waited behind long activities.
They now run inside beat (``durable_scans_in_beat``), which sends only what they find."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.apps import basic
from tests.integration.task_events import Events
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

WINDOW = 60.0  # seconds: the "a minute", on the defaults


def test_an_idle_worker_and_beat_send_at_most_two_library_messages_a_minute(cluster: Any) -> None:
    worker = cluster.start_worker(extra=["-E"])
    beat = cluster.workers.start_beat()
    wait_until(lambda: "scans run in this beat process" in beat.log(), timeout=30, what="beat's scans to start")
    with Events(basic.app) as events:
        time.sleep(WINDOW)  # the measure is what an idle minute sends: nothing to await
        received = [e for e in list(events.seen) if e["type"] == "task-received"]
    library = [e["name"] for e in received if str(e.get("name", "")).startswith("celery_durable.")]
    assert len(library) <= 2, library
    # and the scans did run meanwhile, in beat: its timer scan ticks every second
    assert "Sending due task celery_durable" not in beat.log()
    assert "celery_durable.fire_due_clocks[" not in worker.log()  # never received (the banner lists it)


def test_beat_runs_the_scans_it_used_to_send(cluster: Any) -> None:
    """A workflow sleeping past the timer fast path (a countdown message) is woken by beat's own
    timer scan; nothing queued for a worker."""
    cluster.start_worker(env={"TEST_FAST_TIMER_MAX": "0"})  # every timer left to the scan
    beat = cluster.workers.start_beat(env={"TEST_FAST_TIMER_MAX": "0"})
    wait_until(lambda: "scans run in this beat process" in beat.log(), timeout=30, what="beat's scans to start")
    h = basic.sleeper.start("beat-scan", 1.0)
    late = h.result(timeout=60)
    assert 0 <= late < 5, late  # the scan runs every second (durable_clock_interval)


def test_beat_scans_again_once_the_store_answers(cluster: Any, tmp_path: Any) -> None:
    """A store beat cannot open (here: a SQLite file in a folder not made yet) fails the scans
    and logs it; they go on, and open the store once it can be opened."""
    folder = tmp_path / "not-yet"
    beat = cluster.workers.start_beat(env={"DURABLE_STORE_URL": f"sqlite:///{folder / 'durable.db'}"})
    wait_until(lambda: "timers scan failed" in beat.log(), timeout=30, what="beat to fail opening the store")
    folder.mkdir()
    wait_until(lambda: (folder / "durable.db").exists(), timeout=30, what="a scan to open the store")
