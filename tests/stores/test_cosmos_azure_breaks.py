"""Adversarial review of issue 16 (Cosmos DB as Azure runs it): the opt-in account profile."""

from __future__ import annotations

import os
import time
from urllib.parse import quote

import pytest

from celery_durable.stores import store_from_url
from celery_durable.stores.cosmos.config import KEY_ENV
from celery_durable.testing.cosmos_server import CosmosTestServer
from harness.cosmos_account import fresh_container

pytestmark = pytest.mark.cosmos


def test_a_fresh_container_url_never_holds_the_key(
    cosmos_server: CosmosTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DURABLE_TEST_COSMOS_URL`` may carry ``key=``. The fresh URL is the ``store_url`` fixture's
    value, and pytest prints fixture values of a failing test (``store_url = 'cosmos://…'``):
    the key must not be in it. The store opened from it must still authenticate."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    url = f"cosmos://{cosmos_server.host}:{cosmos_server.port}/?verify=false&key=" + quote(cosmos_server.key, safe="")
    with fresh_container(url) as fresh:
        for form in (cosmos_server.key, quote(cosmos_server.key, safe=""), quote(cosmos_server.key)):
            assert form not in fresh
        store = store_from_url(fresh)
        try:
            store.create({"pk": "p", "id": "d"})
            assert store.read("p", "d") is not None
        finally:
            store.close()
    assert os.environ.get(KEY_ENV) in (None, cosmos_server.key)


def test_a_signal_to_an_execution_another_process_just_started_is_not_failed_by_a_stale_read(
    cosmos_server: CosmosTestServer, cosmos_url: str
) -> None:
    """``wf.signal_external`` from a worker that never wrote the target's partition reads it
    without a session token. On a lagging replica the target (just started by another process)
    looks absent: the send must not record a permanent "no such execution" for the sender."""
    from celery_durable import workflow as wf
    from tests.engine.inprocess import InProcess

    starter, sender = InProcess(store=store_from_url(cosmos_url)), InProcess(store=store_from_url(cosmos_url))

    def target() -> int:
        return int(wf.wait_signal("go", int))

    def send() -> str:
        wf.signal_external("lag-target", "go", 7)
        return "sent"

    target_def = starter.workflow(target, signals={"go": int})
    sender.workflow(target, signals={"go": int})
    send_def = sender.workflow(send)
    cosmos_server.set_replica_lag(1000)
    try:
        starter.engine.start(target_def, (), {}, workflow_id="lag-target")  # another process
        sid = sender.start(send_def)  # its drive reads the target's partition with no token
        deadline = time.monotonic() + 30
        while sender.status(sid) == "running" and time.monotonic() < deadline:
            time.sleep(1.5)  # the replica catches up (real time) ...
            sender.clock.advance(10)  # type: ignore[attr-defined]  # ... and recovery looks again
            sender.engine.recovery.scan()
            sender.run()
        assert sender.status(sid) == "completed", sender.ex(sid).get("error")
        starter.run()
        assert starter.status("lag-target") == "completed" and starter.ex("lag-target")["result"] == 7
    finally:
        cosmos_server.set_replica_lag(0)
        starter.store.close()
        sender.store.close()
