"""Timers and signals through real ``celery worker`` and ``celery beat`` processes."""

from __future__ import annotations

import pytest

from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


def _woke(cluster, key: str) -> int:  # type: ignore[no-untyped-def]
    path = cluster.workers.tmp / "marks" / f"woke-{key}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_fast_path_fires_short_timer_without_beat(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.sleeper.start("fast", 1.0)
    lateness = h.result(timeout=30)
    assert 0 <= lateness < 2.0
    assert _woke(cluster, "fast") == 1


def test_beat_fires_when_fast_path_is_off(cluster) -> None:  # type: ignore[no-untyped-def]
    env = {"TEST_FAST_TIMER_MAX": "0", "TEST_CLOCK_INTERVAL": "0.5"}
    cluster.start_worker(env=env)
    cluster.durable.configure(store=cluster.store_url, timer_fast_path_max=0)
    h = basic.sleeper.start("scan", 1.0)
    assert h.status() == "running"
    cluster.workers.start_beat(env=env)
    lateness = h.result(timeout=30)
    assert 0 <= lateness < 5.0
    assert _woke(cluster, "scan") == 1


def test_worker_restarted_during_sleep(cluster) -> None:  # type: ignore[no-untyped-def]
    env = {"TEST_CLOCK_INTERVAL": "0.5"}
    first = cluster.start_worker(env=env)
    h = basic.sleeper.start("restart", 3.0)
    store = cluster.durable.store
    wait_until(lambda: store.read(h.id, "s:000002"), what="the sleep to be recorded")
    first.kill()  # the countdown message dies with the worker
    cluster.start_worker(env=env)
    cluster.workers.start_beat(env=env)
    assert h.result(timeout=60) >= 0
    assert _woke(cluster, "restart") == 1


def test_two_beats_fire_each_timer_once(cluster) -> None:  # type: ignore[no-untyped-def]
    env = {"TEST_FAST_TIMER_MAX": "0", "TEST_CLOCK_INTERVAL": "0.3"}
    cluster.start_worker(env=env, concurrency=4)
    cluster.durable.configure(store=cluster.store_url, timer_fast_path_max=0)
    handles = [basic.sleeper.start(f"two-{i}", 1.0) for i in range(20)]
    cluster.workers.start_beat(env=env)
    cluster.workers.start_beat(env=env)
    for h in handles:
        h.result(timeout=60)
    assert [_woke(cluster, f"two-{i}") for i in range(20)] == [1] * 20
    for h in handles:  # exactly one recorded firing, and one activity run after it
        docs = {d["id"]: d for d in cluster.durable.store.query_partition(h.id).docs}
        assert docs["r:000002"]["ok"] is True
        assert docs["r:000004"]["attempts"] == 1 and docs["r:000004"]["value"] == 1


def test_signal_from_outside_reaches_waiting_workflow(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.approval.start(60.0)
    wait_until(lambda: cluster.durable.store.read(h.id, "s:000001"), what="the wait to be recorded")
    assert h.signal("approval", basic.Approval(ok=True, by="ops")) is True
    assert h.result(timeout=30) == "ops:True"
    assert h.signal("approval", basic.Approval(ok=False, by="late")) is False


def test_signal_timeout_fires_through_fast_path(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.approval.start(1.0)
    assert h.result(timeout=30) == "DurableTimeoutError"


def test_schedule_starts_one_execution_per_tick_with_two_beats(cluster) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from celery_durable.glue.tasks import tick_id

    env = {"TEST_SCHEDULE_EVERY": "1"}
    cluster.start_worker(env=env, concurrency=2)
    cluster.workers.start_beat(env=env)
    cluster.workers.start_beat(env=env)
    store = cluster.durable.store
    # count ticks from the first one a beat started (a loaded machine may take seconds to start a
    # beat), leaving the second beat a few ticks to join: 4 whole ticks after that
    first = wait_until(lambda: sorted(store.scan_partitions("every@")), timeout=60, what="a first tick")
    start = datetime.strptime(str(first[0]).split("@", 1)[1], "%Y%m%dT%H%M%S").replace(tzinfo=UTC).timestamp()
    ticks = [tick_id("every", 1.0, start + 3 + i) for i in range(4)]
    for wid in ticks:
        wait_until(
            lambda wid=wid: (d := store.read(wid, "exec")) and d["status"] == "completed",
            timeout=30,
            what=f"scheduled execution {wid}",
        )
    for w in cluster.workers.workers:
        w.stop()
    ids = store.scan_partitions("every@")
    marks = (cluster.workers.tmp / "marks" / "tick-sched").read_text().splitlines()
    # one execution per tick, and its activity ran once: marks == executions
    assert len(ids) == len(set(ids)) == len(marks)
    assert set(ticks) <= set(ids)
