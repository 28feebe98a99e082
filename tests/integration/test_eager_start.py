"""Eager start with real ``celery worker`` processes (``durable_eager_start``, issue 15): the
caller drives the first step and sends the first activities itself; the workers run the rest.
The setting is the caller's own: the workers here run without it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.apps import basic

pytestmark = pytest.mark.worker

STORES = [
    pytest.param(("redis", "sqlite"), id="redis-sqlite"),
    pytest.param(("redis", "postgres"), id="redis-postgres"),
    pytest.param(("redis", "cosmos"), id="redis-cosmos", marks=pytest.mark.cosmos),
]


@pytest.fixture(autouse=True)
def _restore_settings() -> Iterator[None]:
    yield
    basic.durable.configure(store=None, eager_start=None)  # None drops the override


@pytest.mark.parametrize("cluster", STORES, indirect=True)
def test_the_caller_drives_the_first_step_and_workers_the_rest(cluster) -> None:  # type: ignore[no-untyped-def]
    basic.durable.configure(store=cluster.store_url, eager_start=True)
    cluster.start_worker()
    counters = basic.durable.engine.counters
    before = counters.snapshot().get("drive_committed", 0)
    h = basic.sum_chain.start(5)
    # committed here, before start() returned: the caller's own drive, not a worker's
    assert counters.snapshot().get("drive_committed", 0) == before + 1
    ex = basic.durable.store.read(h.id, "exec")
    assert ex is not None and ex["steps"] >= 1
    assert h.result(timeout=60) == 10
    items = [basic.Item(sku=f"s{i}", qty=i) for i in range(4)]
    assert basic.fan_out.start(items).result(timeout=60) == [f"box:s{i}x{i}" for i in range(4)]
    assert counters.snapshot().get("drive_committed", 0) == before + 2  # the rest ran on the worker
