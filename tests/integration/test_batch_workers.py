"""Issue 27 §2 on real ``celery worker`` processes: a batch started from the caller is run by the
workers as a durable workflow — it signals every waiting execution of a workflow (and no other),
page by page, and a batch that pauses then unpauses them leaves them running on, on SQLite and
PostgreSQL (the Cosmos test server: the same code path, covered by the store tests)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.apps import basic

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_a_batch_signal_reaches_every_selected_execution(cluster: Any) -> None:
    cluster.start_worker(concurrency=2)
    key = uuid.uuid4().hex[:8]
    waiting = [basic.tagged.options(search={"batch": key}).start(f"{key}-{i}") for i in range(5)]
    other = basic.tagged.start(f"{key}-other")  # not selected: another search value
    paused = basic.durable.batch("pause", workflow="tagged", search={"batch": key}, page_size=2)
    assert paused.result(timeout=60)["done"] == 5
    assert all(basic.durable.engine.read_exec(h.id).get("paused") for h in waiting)
    assert basic.durable.batch("unpause", workflow="tagged", search={"batch": key}).result(timeout=60)["done"] == 5
    sent = basic.durable.batch("signal", workflow="tagged", search={"batch": key}, signal="go", value="ok", page_size=2)
    result = sent.result(timeout=60)
    assert (result["matched"], result["done"], result["refused"], result["pages"]) == (5, 5, 0, 3)
    assert [h.result(timeout=60) for h in waiting] == ["ok"] * 5
    assert other.status() == "running"
    other.signal("go", "later")
    assert other.result(timeout=60) == "later"
