"""Session consistency on Cosmos (issue 16): the test server's replica-lag mode, and the store
carrying session tokens so a reader in another process sees the writer's writes."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from azure.cosmos import ContainerProxy, CosmosClient, PartitionKey
from azure.cosmos import exceptions as cx

from celery_durable.stores import store_from_url
from celery_durable.stores.base import Store
from celery_durable.stores.cosmos.session import merge_tokens
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.cosmos_server import CosmosTestServer

pytestmark = pytest.mark.cosmos

LAG_MS = 1500  # long enough that the checks below run well inside the window on a loaded machine


@pytest.fixture
def lagging(cosmos_server: CosmosTestServer) -> Iterator[CosmosTestServer]:
    cosmos_server.set_replica_lag(LAG_MS)
    try:
        yield cosmos_server
    finally:
        cosmos_server.set_replica_lag(0)


@pytest.fixture
def container(lagging: CosmosTestServer) -> Iterator[ContainerProxy]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = CosmosClient(lagging.endpoint, credential=lagging.key, connection_verify=False)
        db = client.create_database_if_not_exists("session_checks")
        yield db.create_container(f"c{uuid.uuid4().hex[:12]}", partition_key=PartitionKey(path="/pk"))
        client.close()


def _token_of(write: Any) -> str:
    headers: dict[str, str] = {}
    write(lambda h, _r: headers.update(h))
    token = headers.get("x-ms-session-token")
    assert token, f"no session token in the write's response: {sorted(headers)}"
    return token


def _query(c: ContainerProxy, pk: str, **kw: Any) -> list[dict[str, Any]]:
    return list(
        c.query_items(
            "SELECT * FROM c WHERE c.pk = @pk", parameters=[{"name": "@pk", "value": pk}], partition_key=pk, **kw
        )
    )


def test_replica_lag_mode_serves_the_previous_version_without_a_fresh_token(container: ContainerProxy) -> None:
    c = container
    first = _token_of(lambda hook: c.create_item({"pk": "p", "id": "a", "v": 1}, response_hook=hook))
    # a just-created document: not found without a token, found with the write's
    with pytest.raises(cx.CosmosResourceNotFoundError):
        c.read_item("a", partition_key="p")
    assert c.read_item("a", partition_key="p", session_token=first)["v"] == 1
    assert _query(c, "p") == []
    assert [d["v"] for d in _query(c, "p", session_token=first)] == [1]

    second = _token_of(lambda hook: c.replace_item("a", {"pk": "p", "id": "a", "v": 2}, response_hook=hook))
    # the token of the first write is too old for the second one: still the previous version
    assert c.read_item("a", partition_key="p", session_token=first)["v"] == 1
    assert c.read_item("a", partition_key="p", session_token=second)["v"] == 2
    assert [d["v"] for d in _query(c, "p", session_token=second)] == [2]

    gone = _token_of(lambda hook: c.delete_item("a", partition_key="p", response_hook=hook))
    assert c.read_item("a", partition_key="p", session_token=second)["v"] == 2  # deleted, not yet seen
    with pytest.raises(cx.CosmosResourceNotFoundError):
        c.read_item("a", partition_key="p", session_token=gone)


def test_replica_lag_ends_after_the_lag(container: ContainerProxy, lagging: CosmosTestServer) -> None:
    c = container
    lagging.set_replica_lag(200)  # a shorter lag from now on (settable while running)
    lagging.reset_stats()
    c.create_item({"pk": "p", "id": "b", "v": 1})
    c.upsert_item({"pk": "p", "id": "b", "v": 2})

    def tokenless() -> int | None:
        try:
            return int(c.read_item("b", partition_key="p")["v"])
        except cx.CosmosResourceNotFoundError:
            return None

    assert tokenless() is None  # just created: the replica has not seen it
    deadline = time.monotonic() + 5
    while tokenless() != 2:
        assert time.monotonic() < deadline, "the lagging replica never caught up"
        time.sleep(0.05)
    assert lagging.stats()["staleReads"] >= 1


def test_replica_lag_set_at_start() -> None:
    with CosmosTestServer(replica_lag_ms=300) as server:
        assert server._control("GET", "/health")["replicaLagMs"] == 300


def test_batch_writes_are_lagged_as_one(container: ContainerProxy) -> None:
    c = container
    token = _token_of(
        lambda hook: c.execute_item_batch(
            [("create", ({"pk": "q", "id": "x"},)), ("create", ({"pk": "q", "id": "y"},))],
            partition_key="q",
            response_hook=hook,
        )
    )
    assert _query(c, "q") == []
    assert sorted(d["id"] for d in _query(c, "q", session_token=token)) == ["x", "y"]


# --- the store ------------------------------------------------------------------------------


@pytest.mark.foreign_documents  # a store test's own documents, not the engine's
def test_store_reads_its_own_writes_and_another_process_reads_them_with_the_token(
    lagging: CosmosTestServer, cosmos_url: str
) -> None:
    writer, reader = store_from_url(cosmos_url), store_from_url(cosmos_url)
    try:
        writer.create({"pk": "e1", "id": "exec", "v": 1})
        deadline = time.monotonic() + 10
        while reader.read("e1", "exec") is None:  # the lagging replica catches up (no token)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        etag = writer.replace({"pk": "e1", "id": "exec", "v": 2}, if_match=None)
        writer.create({"pk": "e1", "id": "s1", "v": 1})
        # the writer's own reads carry its token
        assert writer.read("e1", "exec")["v"] == 2  # type: ignore[index]
        assert [d and d["id"] for d in writer.read_many("e1", ["exec", "s1"])] == ["exec", "s1"]
        # another process without the token is served the lagging replica
        assert reader.read("e1", "exec")["v"] == 1  # type: ignore[index]
        assert reader.read("e1", "s1") is None
        token = writer.session_token("e1")
        assert token
        reader.use_session_token("e1", token)
        got = reader.read("e1", "exec")
        assert got is not None and got["v"] == 2 and got["_etag"] == etag
        assert [d and d["v"] for d in reader.read_many("e1", ["exec", "s1"])] == [2, 1]
        assert {d["id"] for d in reader.query_partition("e1").docs} == {"exec", "s1"}
        # an older token handed over later never makes reads staler
        reader.use_session_token("e1", "0:-1#1")
        assert reader.read("e1", "exec")["v"] == 2  # type: ignore[index]
        assert writer.session_token("other") is None
    finally:
        writer.close()
        reader.close()


def test_token_api_is_a_no_op_on_strongly_consistent_stores() -> None:
    store: Store = MemoryStore()
    store.create({"pk": "p", "id": "a"})
    assert store.session_token("p") is None
    store.use_session_token("p", "0:-1#5")
    store.use_session_token("p", None)
    assert store.read("p", "a") is not None


def test_merge_tokens_keeps_the_newer_per_range() -> None:
    assert merge_tokens(None, None) is None
    assert merge_tokens("0:-1#5", None) == "0:-1#5"
    assert merge_tokens("0:-1#5", "0:-1#7") == "0:-1#7"
    assert merge_tokens("0:-1#9", "0:-1#7") == "0:-1#9"
    merged = merge_tokens("0:-1#9,1:-1#3", "1:-1#4,2:-1#1")
    assert merged is not None and sorted(merged.split(",")) == ["0:-1#9", "1:-1#4", "2:-1#1"]
    assert merge_tokens("0:1#12#3=10", "0:1#11#3=11") == "0:1#12#3=11"
    assert merge_tokens("garbage", "0:-1#2") == "0:-1#2"


def test_a_lost_write_keeps_the_token_its_error_answers_but_not_a_read_session_miss() -> None:
    """409/412/404 answer the token of what won (kept: the next read sees it); a 404.1002 (the
    replica lacks the session) answers nothing worth keeping, as the .NET SDK decides."""
    from types import SimpleNamespace

    from celery_durable.stores.cosmos.session import CosmosSessions, SessionTokens

    sessions = CosmosSessions()
    sessions._sessions = SessionTokens()
    sessions._session_lost("p", SimpleNamespace(headers={"x-ms-session-token": "0:-1#7"}, sub_status=None))
    assert sessions.session_token("p") == "0:-1#7"
    sessions._session_lost("q", SimpleNamespace(headers={"x-ms-session-token": "0:-1#9"}, sub_status=1002))
    assert sessions.session_token("q") is None
