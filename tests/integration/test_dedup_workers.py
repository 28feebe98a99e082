"""Issue 26 §5 on real ``celery worker`` processes and real stores: callers racing a start with a
dedup key get one execution; ``reject`` refuses while it runs; the key is free once it ended;
``latest-wins`` cancels the running one for the new one."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from celery_durable import DuplicateStart
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("cluster", [("redis", "sqlite"), ("redis", "postgres")], indirect=True)
def test_one_execution_per_key_on_real_workers(cluster: Any) -> None:
    cluster.start_worker()
    key = f"nightly-{uuid.uuid4().hex[:8]}"
    joined = basic.approval.options(dedup_key=key, on_conflict="return-existing")
    with ThreadPoolExecutor(8) as pool:  # eight callers at once
        ids = list(pool.map(lambda _: joined.start(600.0).id, range(8)))
    assert len(set(ids)) == 1, ids
    first = basic.durable.handle(ids[0])
    wait_until(lambda: first.status() == "running", timeout=30, what="the worker to run it")
    with pytest.raises(DuplicateStart) as refused:
        basic.approval.options(dedup_key=key).start(600.0)
    assert refused.value.existing == first.id
    basic.durable.signal(first.id, "approval", {"by": "ops", "ok": True})
    assert first.result(timeout=60) == "ops:True"

    # the key is free again (another workflow may take it: the key is the caller's, not the workflow's)
    second = basic.sleeper.options(dedup_key=key).start("second", 3600.0)
    assert second.id != first.id
    wait_until(lambda: second.status() == "running", timeout=30, what="the second execution")
    third = basic.sleeper.options(dedup_key=key, on_conflict="latest-wins").start("third", 3600.0)
    wait_until(lambda: second.status() == "cancelled", timeout=60, what="the superseded one to be cancelled")
    assert third.status() == "running" and third.id not in (first.id, second.id)
    assert third.cancel()
    wait_until(lambda: third.status() == "cancelled", timeout=60, what="the third to be cancelled")


def test_debounced_starts_run_once_with_the_latest_input_on_real_workers(cluster: Any) -> None:
    """Issue 26 §5 debounce: three starts within the quiet period, on a worker and beat (whose
    clock scan starts the scheduled execution): one execution, run once, with the last input."""
    cluster.workers.env.update(TEST_CLOCK_INTERVAL="0.5")
    cluster.start_worker()
    cluster.workers.start_beat()
    key = f"debounce-{uuid.uuid4().hex[:8]}"
    debounced = basic.sleeper.options(dedup_key=key, debounce=2)
    handles = [debounced.start(f"{key}-{n}", 0.1) for n in range(3)]
    assert len({h.id for h in handles}) == 1
    assert handles[0].status() == "scheduled"
    handles[0].result(timeout=60)
    marks = cluster.workers.tmp / "marks"
    woke = sorted(p.name for p in marks.glob(f"woke-{key}-*")) if marks.exists() else []
    assert woke == [f"woke-{key}-2"]
