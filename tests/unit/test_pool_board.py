"""The shared board a worker's main process writes for its pool processes (glue/pool_board.py)."""

from __future__ import annotations

import os

from celery_durable.glue import pool_board
from celery_durable.glue.pool_board import RING, Board


def test_a_forked_child_sees_what_the_parent_writes_after_the_fork() -> None:
    board = Board()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent's word, then report what it sees
        os.close(write)
        os.read(read, 1)
        seen = board.stopping, board.task_events, board.revoked("a:2"), board.revoked("a:3")
        os._exit(0 if seen == (True, True, True, False) else 1)
    os.close(read)
    board.set_stopping()
    board.set_task_events(True)
    board.revoke(["a:2"])
    os.write(write, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_ring_forgets_only_the_oldest_ids() -> None:
    board = Board()
    board.revoke([f"t:{i}" for i in range(RING + 10)])
    assert not any(board.revoked(f"t:{i}") for i in range(10))
    assert all(board.revoked(f"t:{i}") for i in range(10, RING + 10))
    assert not board.revoked("never")


def test_running_names_this_process_only_while_it_runs() -> None:
    board = Board()
    with board.running("x:1"):
        assert board.running_pids("x:1") == [os.getpid()]
        assert board.running_pids("x:2") == []
    assert board.running_pids("x:1") == []


def test_task_events_follow_the_dispatcher_as_celery_decides(monkeypatch: object) -> None:
    board = Board()
    monkeypatch.setattr(pool_board, "_BOARD", board)  # type: ignore[attr-defined]

    class Dispatcher:
        def __init__(self, enabled: bool, groups: set[str]) -> None:
            self.enabled, self.groups = enabled, groups

    for enabled, groups, on in [
        (True, set(), True),  # -E: no groups is every group
        (True, {"worker"}, False),  # heartbeats only
        (True, {"worker", "task"}, True),  # enable_events
        (False, set(), False),
    ]:
        pool_board.note_task_events(Dispatcher(enabled, groups))
        assert board.task_events is on
    pool_board.note_task_events(None)
    assert board.task_events is False


def test_a_rate_limit_set_at_run_time_is_the_last_one_set() -> None:
    board = Board()
    assert board.rate_limited("t.a") is None
    board.set_rate_limited("t.a", True)
    board.set_rate_limited("t.b", True)
    assert board.rate_limited("t.a") is True
    board.set_rate_limited("t.a", False)
    assert board.rate_limited("t.a") is False and board.rate_limited("t.b") is True
