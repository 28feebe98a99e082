"""Issue 27 §4 on real ``celery worker`` processes: a reader follows a stream live while the
workflow waits half way, gets the rest after the signal, and reads the event's latest value — on
SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_stream_followed_live_and_an_event(cluster: Any) -> None:
    cluster.start_worker(concurrency=2)
    h = basic.publishes.start(6)
    assert h.get_event("stage", timeout=60) == "started"
    live = h.stream("progress", timeout=60)
    first = [next(live) for _ in range(4)]  # 0..3, then it waits for "go"
    assert first == [0, 1, 2, 3]
    wait_until(lambda: h.status() == "running", timeout=10, what="it to wait")
    h.signal("go", True)
    assert list(live) == [4, 5]  # the rest, then the stream ends with the execution
    assert h.get_event("stage") == "finished" and h.result(timeout=30) == sum(2 * i for i in range(6))
