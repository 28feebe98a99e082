"""celery_durable.glue.pools: which worker refuses which effects (no worker process; see
tests/integration/test_outbox_pools.py for the real pools)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable.errors import ConfigurationError
from celery_durable.glue.pools import check_worker, green_threads, pool_name


def _durable(routes: dict[str, Any] | None = None) -> Durable:
    app = Celery("pools-unit", broker="memory://", set_as_current=False)
    app.conf.task_routes = routes or {}
    durable = Durable(app, store="memory://")

    @durable.effect("u.stoppable", queue="os")
    def stoppable(payload: dict[str, int]) -> None: ...

    @durable.effect("u.timed", interruptible=False, timeout=5)
    def timed(payload: dict[str, int]) -> None: ...

    @durable.effect("u.coop", interruptible=False)
    def coop(payload: dict[str, int]) -> None: ...

    return durable


def _worker(durable: Durable, pool: Any, queues: list[str] | None = None) -> SimpleNamespace:
    if queues:
        durable.app.amqp.queues.select(queues)  # what ``-Q`` does
    return SimpleNamespace(app=durable.app, pool_cls=pool)


def test_pool_names() -> None:
    from celery.concurrency import get_implementation

    for alias in ("prefork", "threads", "solo"):
        assert pool_name(get_implementation(alias)) == alias
    for alias in ("gevent", "eventlet"):  # a stand-in class: importing their pools would import them here
        assert pool_name(type("TaskPool", (), {"__module__": f"celery.concurrency.{alias}"})) == alias
    for alias in ("prefork", "threads", "solo", "gevent", "eventlet"):
        assert pool_name(alias) == alias
    assert pool_name("processes") == "prefork"
    assert pool_name(SimpleNamespace) == "types:SimpleNamespace"


def test_no_green_threads_in_the_test_process() -> None:
    assert green_threads() is None


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_os_thread_pools_run_every_effect(pool: str) -> None:
    durable = _durable()
    check_worker(_worker(durable, pool), durable)


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_green_pool_refuses_the_effects_it_consumes_that_need_an_interrupt(pool: str) -> None:
    durable = _durable()
    with pytest.raises(ConfigurationError) as err:
        check_worker(_worker(durable, pool, queues=["celery", "os"]), durable)
    message = str(err.value)
    assert "'u.stoppable' (interruptible=True)" in message and "'u.timed' (timeout=5s)" in message
    assert f"on the {pool} pool" in message and "u.coop" not in message


def test_green_pool_starts_when_those_effects_go_to_queues_it_does_not_consume() -> None:
    # u.stoppable has queue="os"; u.timed is routed there by task_routes
    durable = _durable(routes={"celery_durable.effect.u.timed": {"queue": "os"}})
    check_worker(_worker(durable, "gevent", queues=["celery"]), durable)
    with pytest.raises(ConfigurationError, match=r"'u.stoppable'.*'u.timed'"):
        check_worker(_worker(durable, "gevent", queues=["celery", "os"]), durable)


def test_green_pool_without_queue_options_consumes_the_default_queue_only() -> None:
    durable = _durable()  # u.timed goes to the default queue, u.stoppable to "os"
    with pytest.raises(ConfigurationError, match=r"effect\(s\) 'u.timed' \(timeout=5s\) on"):
        check_worker(_worker(durable, "eventlet"), durable)
