"""SQLite store: how a writer waits for another process's write lock (``SqliteStore._begin``).

The holder is a separate process with a plain ``sqlite3`` connection: it takes the write lock
(``BEGIN IMMEDIATE``), reports it, and commits when told to (or after a fallback delay).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_durable.errors import StoreUnavailable
from celery_durable.stores import Op
from celery_durable.stores.sqlite import store as sqlite_module
from celery_durable.stores.sqlite.store import SqliteStore

HOLDER = """
import select, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE meta SET seq = seq + 1000 WHERE k = 0")
print("held", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))  # until told to release, at most that long
conn.execute("COMMIT")
print("released", flush=True)
"""


class Holder:
    """Another process holding the file's write lock until :meth:`release` (or ``fallback`` s)."""

    def __init__(self, path: Path, fallback: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path), str(fallback)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def wait_released(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "released\n"
        assert self.proc.wait(30) == 0
        self._close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._close()

    def _close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    db = tmp_path / "s.db"
    store = SqliteStore(str(db))
    assert store.read("p", "a") is None  # the schema is in place before a holder starts
    store.close()
    yield db


def batch(store: SqliteStore) -> list[str | None]:
    return store.batch("p", [Op.upsert({"pk": "p", "id": "a", "v": 1}), Op.upsert({"pk": "p", "id": "b"})])


def test_a_lock_held_briefly_by_another_process_is_waited_for_in_short_sleeps(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(str(path), busy_timeout=10)
    holder = Holder(path, fallback=3.0)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:  # the writer found the lock taken and waits: now let it go
            holder.release()
        time.sleep(seconds)

    monkeypatch.setattr(sqlite_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    try:
        versions = batch(store)
        holder.wait_released()
    finally:
        holder.stop()
    # it waited in our own short sleeps (SQLite's busy handler sleeps 1, 2, 5 ... ms, unseen here)
    assert sleeps and max(sleeps) <= sqlite_module.WAIT_MAX
    # ... and wrote after the holder's commit, not beside it
    assert [int(v) for v in versions if v] == [1001, 1002]
    assert store.read("p", "a")["v"] == 1  # type: ignore[index]
    store.close()


def test_many_processes_writing_at_once_all_succeed(path: Path) -> None:
    """Nine writer processes race for the lock: every write commits, versions stay unique."""
    script = (
        "import sys; from celery_durable.stores import Op; from celery_durable.stores.sqlite.store import SqliteStore\n"
        "s = SqliteStore(sys.argv[1], busy_timeout=30)\n"
        "for i in range(150):\n"
        "    pk = f'{sys.argv[2]}-{i}'\n"
        "    s.batch(pk, [Op.upsert({'pk': pk, 'id': 'a', 'd': 'x' * 450}), Op.upsert({'pk': pk, 'id': 'b'})])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), f"w{n}"]) for n in range(9)]
    assert [p.wait(120) for p in procs] == [0] * 9
    with sqlite3.connect(path) as raw:
        sql = "SELECT count(*), count(DISTINCT version), max(version) FROM docs"
        count, distinct, top = raw.execute(sql).fetchone()
    assert count == distinct == top == 9 * 150 * 2


def test_a_lock_held_past_busy_timeout_raises_the_same_error_as_before(path: Path) -> None:
    store = SqliteStore(str(path), busy_timeout=0.3)
    holder = Holder(path, fallback=60.0)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            batch(store)
        waited = time.monotonic() - started
        # the error SQLite's busy handler gave when it ran out: "database is locked" (SQLITE_BUSY)
        assert str(info.value) == f"sqlite store {str(path)!r}: database is locked"
        cause = info.value.__cause__
        assert isinstance(cause, sqlite3.OperationalError) and cause.sqlite_errorcode == sqlite3.SQLITE_BUSY
        assert 0.3 <= waited < 3.0  # the whole busy_timeout, and not much more
        assert store.read("p", "a") is None  # WAL: reads are not blocked; nothing was written

        zero = SqliteStore(str(path), busy_timeout=0)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="database is locked"):
            batch(zero)
        assert time.monotonic() - started < 0.3  # busy_timeout=0: one try, no wait
        zero.close()
        holder.release()
        holder.wait_released()
    finally:
        holder.stop()
    assert batch(store) == ["1001", "1002"]  # the same store writes again once the lock is free
    store.close()
