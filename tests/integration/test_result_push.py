"""Pushed results with a real ``celery worker`` (issues 14, 15): ``handle.result()`` is woken by the
worker's push (Redis pub/sub; PostgreSQL LISTEN/NOTIFY), not by polling the store.

The client's polling is made very slow (``result_push_recheck`` 30 s) so that only a push can
return the result promptly, and every read of the exec document is counted: a waiter that polls
reads it dozens of times (every 5% of the time waited), one woken by a push two or three times.
The workflow (``shifty``) blocks in an activity until the test opens its gate, after the client
has started waiting.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps import basic
from tests.integration.conftest import Cluster
from tests.plugins.postgres import BASE_URL
from tests.plugins.workers import wait_until

PUSHED = [("redis", "sqlite"), ("redis", "postgres")]
SLOW_POLL = {"result_poll_max": 30.0, "result_push_recheck": 30.0}


@pytest.fixture(autouse=True)
def _restore_settings() -> Iterator[None]:
    yield
    # configure() keeps overrides for later tests: None drops them
    basic.durable.configure(store=None, result_push=None, result_poll_max=None, result_push_recheck=None)


class Waiting:
    """``handle.result()`` in a thread, with the reads of the exec document counted."""

    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        self.engine = cluster.durable.engine
        self.gate = tmp_path / "gate"
        self.reads = 0
        real = self.engine.read_exec

        def counted(eid: str) -> Any:
            self.reads += 1
            return real(eid)

        self.engine.read_exec = counted  # type: ignore[method-assign]
        self.handle = basic.shifty.start(str(tmp_path / "no-flag"), str(self.gate))
        self.value: Any = None
        self.returned_at = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()
        wait_until(lambda: self.reads >= 1, timeout=10, what="the first read of result()")

    def _wait(self) -> None:
        try:
            self.value = self.handle.result(timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc
        self.returned_at = time.time()

    def finish(self, within: float = 20.0) -> float:
        """Open the gate; wait for result(); return how long after the worker's commit it returned."""
        self.gate.write_text("open")
        self.thread.join(within)
        assert not self.thread.is_alive(), f"result() still waiting after {within}s ({self.reads} reads)"
        assert self.error is None, self.error
        assert self.value == "right"
        ex = self.engine.store.read(self.handle.id, "exec")
        assert ex is not None
        return self.returned_at - float(ex["completed_at"])


@pytest.mark.parametrize("cluster", PUSHED, indirect=True)
def test_result_is_pushed_not_polled(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker()
    cluster.durable.configure(store=cluster.store_url, **SLOW_POLL)
    expected = "postgres" if cluster.store_url.startswith("postgresql") else "redis"
    assert cluster.durable.engine.notifier.name == expected
    waiting = Waiting(cluster, tmp_path)
    late = waiting.finish()
    # a poll would have come 30 s later (or read dozens of times): the push woke it
    assert late < 5.0, f"result() returned {late:.2f}s after the commit"
    assert waiting.reads <= 3, f"{waiting.reads} reads of the exec: polled, not pushed"


def test_result_falls_back_to_polling_when_redis_push_is_unreachable(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker()
    # the client's push goes to a closed port; the worker publishes to the real Redis
    cluster.durable.configure(
        store=cluster.store_url, result_push="redis://127.0.0.1:1/0", result_poll_max=0.2, result_push_recheck=30.0
    )
    waiting = Waiting(cluster, tmp_path)
    late = waiting.finish()
    assert cluster.durable.engine.notifier.state == "down"  # type: ignore[attr-defined]
    assert late < 5.0
    assert waiting.reads > 3  # it polled


@pytest.mark.parametrize("cluster", [("redis", "postgres")], indirect=True)
def test_result_falls_back_to_polling_when_the_listen_connection_is_killed(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_worker()
    cluster.durable.configure(store=cluster.store_url, result_poll_max=0.2, result_push_recheck=30.0)
    notifier: Any = cluster.durable.engine.notifier
    assert notifier.name == "postgres"
    waiting = Waiting(cluster, tmp_path)
    assert notifier.state == "up" and notifier.conn is not None
    pid = notifier.conn.info.backend_pid
    # counted before the kill: the waiter's wake-up read may come before the test sees "down"
    reads_before = waiting.reads
    # the listener may not come back (its server is unreachable from now on): the waiter must poll
    notifier.cfg = dataclasses.replace(notifier.cfg, conninfo="postgresql://postgres@127.0.0.1:1/test")
    with psycopg.connect(BASE_URL, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    wait_until(lambda: notifier.state == "down", timeout=10, what="the listener to notice")
    late = waiting.finish()
    # the next check was 30 s away (result_push_recheck): only a wake-up and polling return it early
    assert late < 5.0, f"result() returned {late:.2f}s after the commit"
    assert waiting.reads > reads_before + 1  # woken by the failure, then polled until the end
