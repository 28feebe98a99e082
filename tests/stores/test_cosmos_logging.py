"""A worker at ``--loglevel=INFO`` must not log every Cosmos request (issue 16, chaos with lag).

azure-cosmos 4.x logs each request and response (about 30 lines: method, URL, every header) at
INFO through its own ``CosmosHttpLoggingPolicy``, whose logger is
``azure.cosmos._cosmos_http_logging_policy`` (not azure-core's ``http_logging_policy``). Under
``celery worker --loglevel=INFO`` that was ~40 MB of log per worker in 3 minutes of the chaos
run, enough CPU to push the queue wait past ``activity_queue_timeout`` and make the recovery
scan re-send every waiting activity.
"""

from __future__ import annotations

import logging

import pytest

from celery_durable.stores import store_from_url

pytestmark = pytest.mark.cosmos


def test_store_requests_are_not_logged_at_info(cosmos_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # the root logger, as celery worker --loglevel=INFO sets it
    store = store_from_url(cosmos_url)
    try:
        etag = store.create({"pk": "p", "id": "a", "v": 1})
        store.replace({"pk": "p", "id": "a", "v": 2}, if_match=etag)
        assert store.read("p", "a") is not None
        store.query_partition("p")
    finally:
        store.close()
    chatty = [r for r in caplog.records if r.name.startswith("azure") and r.levelno < logging.WARNING]
    assert chatty == [], f"{len(chatty)} SDK records at INFO, e.g. {chatty[0].name}: {chatty[0].getMessage()[:200]}"


def test_an_application_can_still_turn_the_sdk_request_log_on(
    cosmos_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Quiet by default only: a level the application sets on the SDK's logger is kept."""
    caplog.set_level(logging.INFO, logger="azure.cosmos._cosmos_http_logging_policy")
    store = store_from_url(cosmos_url)
    try:
        store.read("p", "missing")
    finally:
        store.close()
    assert any(r.name == "azure.cosmos._cosmos_http_logging_policy" for r in caplog.records)
