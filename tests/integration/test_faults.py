"""Faults on real worker processes: SIGKILL, SIGSTOP, store outages, two beats, corruption."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from celery_durable import StoreUnavailable
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

FAST = {
    "TEST_LEASE_TTL": "3",
    "TEST_HEARTBEAT": "1",
    "TEST_RECOVERY_INTERVAL": "1",
    "TEST_DRIVE_TIMEOUT": "3",
    "TEST_QUEUE_TIMEOUT": "6",
}


def _count(cluster, name: str) -> int:  # type: ignore[no-untyped-def]
    path = cluster.workers.tmp / "marks" / name
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def fast(cluster):  # type: ignore[no-untyped-def]
    cluster.workers.env.update(FAST)
    cluster.durable.configure(store=cluster.store_url, lease_ttl=3, heartbeat_interval=1, drive_timeout=3)
    return cluster


def test_sigkill_during_activity_completes_elsewhere(fast) -> None:  # type: ignore[no-untyped-def]
    victim = fast.start_worker()
    h = basic.slow_flow.start("k1", 2.0)
    wait_until(lambda: _count(fast, "start-k1") == 1, what="the activity to start")
    victim.kill()
    survivor = fast.start_worker()
    fast.workers.start_beat()
    pid = h.result(timeout=60)
    assert _count(fast, "start-k1") == 2 and _count(fast, "end-k1") == 1
    assert "ForkPoolWorker" in survivor.log() and pid != victim.proc.pid


def test_sigkill_during_drive_completes_elsewhere(fast) -> None:  # type: ignore[no-untyped-def]
    gate = fast.workers.tmp / "gate-drive"
    victim = fast.start_worker()
    h = basic.stalls_in_replay.start(str(gate))
    wait_until(lambda: _count(fast, "drive-stalled") >= 1, what="the drive to stall")
    victim.kill()
    gate.write_text("open")
    fast.start_worker()
    fast.workers.start_beat()
    assert h.result(timeout=60) == 2 + 4


def test_frozen_worker_cannot_overwrite_after_takeover(fast) -> None:  # type: ignore[no-untyped-def]
    frozen = fast.start_worker(concurrency=1)
    h = basic.slow_flow.start("k2", 5.0)
    wait_until(lambda: _count(fast, "start-k2") == 1, what="the activity to start")
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    try:
        fast.start_worker()
        fast.workers.start_beat()
        winner = h.result(timeout=60)
        recorded = fast.durable.store.read(h.id, "r:000001")
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    wait_until(lambda: _count(fast, "end-k2") == 2, timeout=30, what="the resumed attempt to finish")

    def resumed_attempt_returned() -> bool:  # Celery logs it after our __call__ offered the outcome
        return any("tests.apps.basic.slow" in line and "succeeded" in line for line in frozen.log().splitlines())

    wait_until(resumed_attempt_returned, timeout=30, what="the resumed attempt to offer its outcome")
    after = fast.durable.store.read(h.id, "r:000001")
    assert after["_etag"] == recorded["_etag"] and after["value"] == winner
    assert h.poll().status == "completed" and h.result(timeout=1) == winner


def test_sqlite_locked_for_ten_seconds_loses_nothing(fast) -> None:  # type: ignore[no-untyped-def]
    fast.start_worker(concurrency=2)
    fast.workers.start_beat()
    handles = [basic.sum_chain.start(5) for _ in range(5)]
    path = fast.store_url.removeprefix("sqlite:///")
    lock = sqlite3.connect(path, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        # a client during the outage gets the library's own error, not a raw sqlite3 one
        with pytest.raises(StoreUnavailable):
            basic.sum_chain.start(6)
        time.sleep(10)  # the outage itself: ten seconds of a locked store (not synchronisation)
    finally:
        lock.rollback()
        lock.close()
    handles.append(basic.sum_chain.start(6))
    results = [h.result(timeout=120) for h in handles]
    assert results == [10] * 5 + [15]


@pytest.mark.cosmos
@pytest.mark.parametrize("cluster", [("redis", "cosmos")], indirect=True)
def test_cosmos_down_for_ten_seconds_loses_nothing(fast, request) -> None:  # type: ignore[no-untyped-def]
    server = request.getfixturevalue("cosmos_server")
    fast.start_worker(concurrency=2)
    fast.workers.start_beat()
    handles = [basic.sum_chain.start(4) for _ in range(3)]
    server.pause()  # the port stays, nothing answers: workers and beat see StoreUnavailable
    try:
        with pytest.raises(StoreUnavailable):
            basic.sum_chain.start(6)
        time.sleep(10)  # the outage itself (not synchronisation)
    finally:
        server.resume()
    handles.append(basic.sum_chain.start(6))
    assert [h.result(timeout=180) for h in handles] == [6, 6, 6, 15]


def test_two_beats_recover_a_killed_activity_once(fast) -> None:  # type: ignore[no-untyped-def]
    victim = fast.start_worker()
    h = basic.slow_flow.start("k3", 1.5)
    wait_until(lambda: _count(fast, "start-k3") == 1, what="the activity to start")
    victim.kill()
    fast.workers.start_beat()
    fast.workers.start_beat()
    fast.start_worker(concurrency=4)
    h.result(timeout=60)
    time.sleep(3)  # two more recovery rounds of both beats, which must not re-run it
    assert _count(fast, "start-k3") == 2
    assert _count(fast, "end-k3") == 1


def test_corrupt_document_fails_that_execution_only(fast) -> None:  # type: ignore[no-untyped-def]
    broken = basic.sum_chain.start(3)
    healthy = basic.sum_chain.start(4)
    path = fast.store_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        n = conn.execute("UPDATE docs SET body = '{not json' WHERE pk = ? AND id = 'exec'", (broken.id,)).rowcount
    assert n == 1
    fast.start_worker()
    fast.workers.start_beat()
    assert healthy.result(timeout=60) == 6
    info = wait_until(lambda: (i := broken.poll()).done and i, timeout=60, what="the corrupt one to fail")
    assert info.status == "failed"
    assert info.error["type"] == "CorruptDocument" and "exec" in info.error["message"]
    later = basic.sum_chain.start(5)  # scans and drives keep working for everyone else
    assert later.result(timeout=60) == 10
