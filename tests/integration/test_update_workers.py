"""Issue 27 §4 on real ``celery worker`` processes: a client updates a running workflow and gets
its handler's answer after the workflow handled it; a rejected update leaves no step; an
activity's published values are read from the stream; update-with-start starts and answers —
on SQLite, PostgreSQL and the Cosmos test server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_durable import UpdateRejectedError
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


@pytest.mark.parametrize(
    "cluster",
    [("redis", "sqlite"), ("redis", "postgres"), pytest.param(("redis", "cosmos"), marks=pytest.mark.cosmos)],
    indirect=True,
)
def test_a_client_updates_a_running_workflow_and_gets_its_answer(cluster: Any) -> None:
    cluster.start_worker(concurrency=2)
    h = basic.updatable.start(10)
    fill = h.stream("fill", timeout=60)
    assert [next(fill) for _ in range(3)] == [0, 1, 2]  # the activity's values, live
    wait_until(lambda: h.poll().steps >= 5, timeout=60, what="it to wait for stop")
    assert h.update("bump", 5, timeout=60) == 18
    with pytest.raises(UpdateRejectedError, match="positive amount"):
        h.update("bump", -1, timeout=60)
    steps = [d["kind"] for d in basic.durable.engine.store.query_partition(h.id).docs if d.get("type") == "step"]
    assert steps.count("update") == 1
    opts = basic.updatable.options(workflow_id=f"upd-{uuid.uuid4().hex[:8]}")
    h2, answer = opts.update_with_start("bump", (1,), args=(100,), timeout=60)
    assert answer == 101  # applied at its first wait point, before the activity's values
    h.signal("stop", True)
    h2.signal("stop", True)
    assert h.result(timeout=60) == 18 and h2.result(timeout=60) == 104
