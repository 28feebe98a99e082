"""Workflows on real ``celery worker`` processes (DESIGN.md §6; issue: engine on Celery)."""

from __future__ import annotations

import pytest

from celery_durable import PayloadValidationError
from tests.apps import basic
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

BACKENDS = [
    pytest.param(("redis", "sqlite"), id="redis-sqlite"),
    pytest.param(("filesystem", "sqlite"), id="filesystem-sqlite"),
    pytest.param(("rabbitmq", "sqlite"), id="rabbitmq-sqlite"),
    pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
]


@pytest.mark.parametrize("cluster", BACKENDS, indirect=True)
def test_happy_path(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.sum_chain.start(5)
    assert h.result(timeout=60) == 10
    items = [basic.Item(sku=f"s{i}", qty=i) for i in range(4)]
    assert basic.fan_out.start(items).result(timeout=60) == [f"box:s{i}x{i}" for i in range(4)]
    assert h.status() == "completed"


def test_idempotent_start_joins(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    a = basic.fan_out.start([basic.Item(sku="one", qty=1)], _workflow_id="order-1")
    b = basic.fan_out.start([basic.Item(sku="one", qty=1)], _workflow_id="order-1")
    assert a.id == b.id == "order-1"
    assert b.result(timeout=60) == ["box:onex1"]
    marks = cluster.workers.tmp / "marks" / "pack-one"
    assert len(marks.read_text().splitlines()) == 1


def test_retry_then_success(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.retry_then_ok.start("k1", 2)
    assert h.result(timeout=60) == "ok after 3"
    result = cluster.durable.store.read(h.id, "r:000001")
    assert result["ok"] is True and result["attempts"] == 3


def test_retries_exhausted_then_caught(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    out = basic.compensate.start("k2").result(timeout=60)
    assert out == {"caught": "ConnectionError", "attempts": 3, "undo": 2}
    assert len((cluster.workers.tmp / "marks" / "down-k2").read_text().splitlines()) == 3


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
