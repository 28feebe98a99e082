"""Workflows on real ``celery worker`` processes (docs/architecture.md §6; issue: engine on Celery)."""

from __future__ import annotations

import pytest

from celery_durable import PayloadValidationError
from celery_durable.engine.documents.schema import task_id_of
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

STORES = [
    pytest.param(("redis", "sqlite"), id="sqlite"),
    pytest.param(("redis", "cosmos"), id="cosmos", marks=pytest.mark.cosmos),
]

BACKENDS = [
    pytest.param(("redis", "sqlite"), id="redis-sqlite"),
    pytest.param(("filesystem", "sqlite"), id="filesystem-sqlite"),
    pytest.param(("rabbitmq", "sqlite"), id="rabbitmq-sqlite"),
    pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
    pytest.param(("redis", "postgres"), id="redis-postgres"),
]
#: the representative tests also run on PostgreSQL (every STORES test would double the runtime)
WITH_POSTGRES = [*STORES, pytest.param(("redis", "postgres"), id="postgres")]


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_happy_path(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.sum_chain.start(5)
    assert h.result(timeout=60) == 10
    items = [basic.Item(sku=f"s{i}", qty=i) for i in range(4)]
    assert basic.fan_out.start(items).result(timeout=60) == [f"box:s{i}x{i}" for i in range(4)]
    assert h.status() == "completed"


@pytest.mark.parametrize("cluster", WITH_POSTGRES, indirect=True)
def test_idempotent_start_joins(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    a = basic.fan_out.start([basic.Item(sku="one", qty=1)], _workflow_id="order-1")
    b = basic.fan_out.start([basic.Item(sku="one", qty=1)], _workflow_id="order-1")
    assert a.id == b.id == "order-1"
    assert b.result(timeout=60) == ["box:onex1"]
    marks = cluster.workers.tmp / "marks" / "pack-one"
    assert len(marks.read_text().splitlines()) == 1


@pytest.mark.parametrize("cluster", STORES, indirect=True)
def test_retry_then_success(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.retry_then_ok.start("k1", 2)
    assert h.result(timeout=60) == "ok after 3"
    result = cluster.durable.store.read(h.id, "r:000001")
    assert result["ok"] is True and result["attempts"] == 3


@pytest.mark.parametrize("cluster", STORES, indirect=True)
def test_retries_exhausted_then_caught(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    out = basic.compensate.start("k2").result(timeout=60)
    assert out == {"caught": "ConnectionError", "attempts": 3, "undo": 2}
    assert len((cluster.workers.tmp / "marks" / "down-k2").read_text().splitlines()) == 3


@pytest.mark.parametrize("cluster", STORES, indirect=True)
def test_non_retryable_skips_retries(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    out = basic.non_retryable.start("k3").result(timeout=60)
    assert out == {"caught": "NonRetryableError", "attempts": 1}
    assert len((cluster.workers.tmp / "marks" / "refuses-k3").read_text().splitlines()) == 1


def test_stacked_on_app_task(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    assert basic.stacked_flow.start(20).result(timeout=60) == 41
    assert basic.stacked(3) == 6  # outside a workflow: a plain call


def test_invalid_payload_rejected_in_caller(cluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PayloadValidationError, match="qty"):
        basic.fan_out.start([{"sku": "x", "qty": "many"}], _workflow_id="bad-1")
    assert cluster.durable.store.read("bad-1", "exec") is None


@pytest.mark.parametrize("cluster", WITH_POSTGRES, indirect=True)
def test_duplicate_delivery_records_one_result(cluster) -> None:  # type: ignore[no-untyped-def]
    from celery_durable.engine.dispatcher import ActivityRequest

    cluster.start_worker(concurrency=4)
    gate_file = cluster.workers.tmp / "gate-dup"
    h = basic.shifty.start(str(cluster.workers.tmp / "no-flag"), str(gate_file))
    store = cluster.durable.store
    marker = wait_until(lambda: store.read(h.id, "s:000002"), what="the gate step to be scheduled")
    req = ActivityRequest(
        h.id, 2, marker["name"], marker["input"]["args"], marker["input"]["kwargs"], task_id_of(marker), "shifty"
    )
    for _ in range(3):  # the broker delivers the same message again, several times
        cluster.durable.engine.dispatcher.send_activity(req)
    gate_file.write_text("open")
    assert h.result(timeout=60) == "right"
    result = store.read(h.id, "r:000002")
    assert result["ok"] is True and result["attempts"] == 1
    for _ in range(2):  # late duplicates after completion change nothing
        cluster.durable.engine.dispatcher.send_activity(req)
    first = store.read(h.id, "r:000002")
    assert first["_etag"] == result["_etag"]


@pytest.mark.parametrize("cluster", [STORES[0], WITH_POSTGRES[-1]], indirect=True)
def test_racing_completions_lose_no_wakeup(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker(concurrency=4)
    cluster.start_worker(concurrency=4)
    h = basic.racing.start(500)
    assert h.result(timeout=240) == sum(range(500))
    docs = cluster.durable.store.query_partition(h.id).docs
    assert sum(1 for d in docs if d["id"].startswith("r:")) == 500


def test_thousand_step_workflow(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker(concurrency=2)
    h = basic.sum_chain.start(1000)
    assert h.result(timeout=280) == sum(range(1000))
    info = h.poll()
    assert info.steps == 1000


def test_nondeterminism_fails_with_both_steps_named(cluster) -> None:  # type: ignore[no-untyped-def]
    from celery_durable import WorkflowFailedError

    # replays from the top, as a restarted worker running changed code does (a live instance
    # kept by the sticky cache has already taken the branch: it would never re-run it)
    cluster.start_worker(env={"TEST_STICKY_CACHE_SIZE": "0"})
    flag = cluster.workers.tmp / "flag"
    gate_file = cluster.workers.tmp / "gate-nd"
    h = basic.shifty.start(str(flag), str(gate_file))
    store = cluster.durable.store
    wait_until(lambda: store.read(h.id, "s:000002"), what="the gate step to be scheduled")
    flag.write_text("now the code takes the other branch")
    gate_file.write_text("open")
    with pytest.raises(WorkflowFailedError) as info:
        h.result(timeout=60)
    assert info.value.type_name == "NonDeterminismError"
    assert "'tests.apps.basic.right'" in info.value.message and "'tests.apps.basic.left'" in info.value.message


@pytest.mark.parametrize("cluster", STORES, indirect=True)
def test_unknown_workflow_is_reported_and_kept(cluster) -> None:  # type: ignore[no-untyped-def]
    def only_in_the_caller(n: int) -> int:
        return n

    wf = cluster.durable.workflow(name="only_in_the_caller")(only_in_the_caller)
    try:
        worker = cluster.start_worker()
        h = wf.start(7)
        info = wait_until(lambda: (i := h.poll()).last_error and i, what="the worker to report the unknown name")
        assert info.status == "running"
        assert "only_in_the_caller" in info.last_error and "not registered" in info.last_error
        doc = cluster.durable.store.read(h.id, "exec")
        assert doc["payload"] == {"args": [7], "kwargs": {}}  # nothing lost
        assert doc["due_kind"] == "exec"  # will be retried by recovery
        assert "not registered" in worker.log()
    finally:
        cluster.durable.registry.workflows.pop("only_in_the_caller", None)
