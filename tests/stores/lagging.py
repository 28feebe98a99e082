"""Two "processes" on the Cosmos test server in replica-lag mode: two store objects, each with
its own session tokens, so one's writes are stale to the other's reads for the lag."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from celery_durable.stores import store_from_url
from celery_durable.stores.base import Store
from celery_durable.testing.cosmos_server import CosmosTestServer


@contextmanager
def lagging_pair(server: CosmosTestServer, database: str, lag_ms: int) -> Iterator[tuple[Store, Store]]:
    """(client, worker) on a fresh container of ``database`` while the server lags ``lag_ms``."""
    url = server.url_for(database, f"c{uuid.uuid4().hex[:12]}")
    client, worker = store_from_url(url), store_from_url(url)
    server.set_replica_lag(lag_ms)
    try:
        yield client, worker
    finally:
        server.set_replica_lag(0)
        client.close()
        worker.close()
