"""Issue 26 §1 on real ``celery worker`` processes: a keyed limit holds across two workers (at
most ``max_running`` of a key at once, observed from the activities themselves, other keys
running beside them), and the slots of a SIGKILLed worker free after their lease so the waiting
steps still run, each once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

FAST = {
    "TEST_LEASE_TTL": "3",
    "TEST_HEARTBEAT": "0.5",
    "TEST_RECOVERY_INTERVAL": "1",
    "TEST_DRIVE_TIMEOUT": "3",
    "TEST_QUEUE_TIMEOUT": "6",
}


@pytest.fixture
def fast(cluster: Any) -> Any:
    cluster.workers.env.update(FAST, TEST_MARKS_DIR=str(cluster.workers.tmp / "marks"))
    return cluster


def _spans(marks: Path, key: str, killed_at: float | None = None) -> list[tuple[float, int]]:
    """(time, +1 start / -1 end) of every run of ``key``'s activities, in time order (an end
    before a start at the same instant). A process runs one at a time: a start its process never
    ended (SIGKILLed) ends at ``killed_at``."""
    path = marks / f"span-{key}"
    events: list[tuple[float, int]] = []
    open_by_pid: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, at, pid = line.split()
        if kind == "start":
            if pid in open_by_pid:
                raise AssertionError(f"process {pid} started a second run before ending the first")
            open_by_pid[pid] = float(at)
        else:
            events += [(open_by_pid.pop(pid), 1), (float(at), -1)]
    assert not open_by_pid or killed_at is not None, f"runs never ended: {open_by_pid}"
    for started in open_by_pid.values():
        assert killed_at is not None
        events += [(started, 1), (killed_at, -1)]
    return sorted(events)


def _max_running(events: list[tuple[float, int]]) -> int:
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def _started(marks: Path, key: str) -> int:
    path = marks / f"lim-{key}"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize(
    "cluster",
    [
        ("redis", "sqlite"),
        ("redis", "postgres"),
        pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
    ],
    indirect=True,
)
def test_at_most_two_per_key_across_two_workers(fast: Any) -> None:
    """Two workers of 3 processes each (6 could run at once): 8 steps of key a and 8 of key b,
    each 0.4 s. Never more than 2 of a key ran at once, both keys did reach 2, and all ran once."""
    fast.start_worker(concurrency=3)
    fast.start_worker(concurrency=3)
    marks = fast.workers.tmp / "marks"
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    ha = basic.limited_fan.start(a, 8, 0.4)
    hb = basic.limited_fan.start(b, 8, 0.4)
    assert ha.result(timeout=120) == list(range(8))
    assert hb.result(timeout=120) == list(range(8))
    for key in (a, b):
        events = _spans(marks, key)
        assert len(events) == 16 and _started(marks, key) == 8  # each step ran once
        assert _max_running(events) == 2, f"key {key}: {events}"


def _lanes(marks: Path, key: str) -> tuple[set[str], list[float]]:
    """The processes that ran ``key``'s steps, and for each step that started after a run of the
    key had ended, the gap (s) from the latest end in its own process (inf: none there)."""
    lines = [line.split() for line in (marks / f"span-{key}").read_text().splitlines()]
    pids = {pid for kind, _, pid in lines if kind == "start"}
    gaps: list[float] = []
    last_end: dict[str, float] = {}
    for kind, at, pid in sorted(lines, key=lambda parts: float(parts[1])):
        if kind == "end":
            last_end[pid] = float(at)
        elif last_end:
            gaps.append(float(at) - last_end[pid] if pid in last_end else float("inf"))
    return pids, gaps


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_freed_slot_is_handed_to_the_next_step_in_its_own_process(fast: Any) -> None:
    """One worker of 4 processes, 8 steps of one key under ``max_running=2``: the process whose
    step frees a slot runs the next holder itself (no broker round trip), so the key's steps run
    in 2 lanes, each waiting step starting in the process that just ended one, and the worker
    says so for each (``run here, not sent``). Idle processes were there to take a message."""
    worker = fast.start_worker(concurrency=4)
    marks = fast.workers.tmp / "marks"
    key = f"h{uuid.uuid4().hex[:6]}"
    assert basic.limited_fan.start(key, 8, 0.3).result(timeout=120) == list(range(8))
    pids, gaps = _lanes(marks, key)
    assert len(pids) == 2, f"the key's steps ran in processes {pids}, not in the 2 lanes its slots free on"
    assert len(gaps) == 6 and max(gaps) < 1.0, gaps
    assert worker.log().count("): run here, not sent") >= 6


def test_a_worker_killed_in_the_middle_of_its_hand_offs_loses_no_step(fast: Any) -> None:
    """SIGKILL the only worker while its processes run a key's steps one after another as
    hand-offs (a grant held in a process's memory dies with it): a new worker and beat finish
    every step (the lapsed slots and the lost grants made up by the limit's scan), never more
    than 2 at once."""
    victim = fast.start_worker(concurrency=4)
    marks = fast.workers.tmp / "marks"
    key = f"x{uuid.uuid4().hex[:6]}"
    handle = basic.limited_fan.start(key, 10, 0.5)
    wait_until(lambda: _started(marks, key) >= 5, timeout=60, what="hand-offs under way")
    victim.kill()
    killed_at = time.time()
    fast.start_worker(concurrency=4)
    fast.workers.start_beat()
    assert handle.result(timeout=120) == list(range(10))
    assert _max_running(_spans(marks, key, killed_at)) == 2


def test_a_killed_workers_slots_free_after_their_lease(fast: Any) -> None:
    """The only worker runs the first 2 steps (their slots taken) and is SIGKILLed; a new worker
    and beat take over: the lapsed slots are freed (their steps' leases lapsed too), the steps
    re-sent, and every step completes."""
    victim = fast.start_worker(concurrency=2)
    marks = fast.workers.tmp / "marks"
    key = f"k{uuid.uuid4().hex[:6]}"
    handle = basic.limited_fan.start(key, 4, 3.0)
    wait_until(lambda: _started(marks, key) == 2, timeout=60, what="two steps to take the slots")
    victim.kill()
    killed_at = time.time()
    fast.start_worker(concurrency=2)
    fast.workers.start_beat()
    assert handle.result(timeout=120) == list(range(4))
    assert _max_running(_spans(marks, key, killed_at)) == 2


def _workflow_spans(marks: Path, key: str) -> list[tuple[float, int]]:
    """(time, +1/-1) of each execution's first and last step of ``key`` (a re-run step may mark
    twice: its first start and last end bound it)."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    path = marks / f"wspan-{key}"
    for line in path.read_text().splitlines() if path.exists() else []:
        what, at, tag = line.split()
        if what == "start":
            starts[tag] = min(starts.get(tag, float(at)), float(at))
        else:
            ends[tag] = max(ends.get(tag, float(at)), float(at))
    assert set(starts) == set(ends), f"unfinished: {set(starts) ^ set(ends)}"
    return sorted([(t, 1) for t in starts.values()] + [(t, -1) for t in ends.values()])


@pytest.mark.parametrize(
    "cluster",
    [
        ("redis", "sqlite"),
        ("redis", "postgres"),
        pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
    ],
    indirect=True,
)
def test_limited_workflows_at_most_two_per_key_across_two_workers(fast: Any) -> None:
    """``@durable.workflow(limit=Limit(max_running=2, key=...))``: 6 executions of key a and 3 of
    key b on two workers of 3 processes: never more than 2 executions of a key ran at once (from
    their own first and last steps), key a did reach 2, the rest waited ``queued``, all completed."""
    fast.start_worker(concurrency=3)
    fast.start_worker(concurrency=3)
    marks = fast.workers.tmp / "marks"
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    handles = [basic.limited_tenant.start(a, f"a{i}", 0.8) for i in range(6)]
    handles += [basic.limited_tenant.start(b, f"b{i}", 0.8) for i in range(3)]
    statuses = [h.status() for h in handles[:6]]
    assert statuses.count("queued") >= 2, statuses  # 2 run at first: most of the others wait
    assert [h.result(timeout=120) for h in handles] == [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(3)]
    assert _max_running(_workflow_spans(marks, a)) == 2
    assert _max_running(_workflow_spans(marks, b)) <= 2
