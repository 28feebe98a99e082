"""The Cosmos test server behaves like real Cosmos where it matters, and the Cosmos store copes
with what real Cosmos does: throttling, outages, illegal ids, the 2 MB limit, secrets.

Deviations of ``@vercel/cosmosdb-server`` are listed in ``celery_durable/testing/cosmos_server.js``
and ``docs/cosmos-test-server.md``; each has a test here (``test_deviation_*``) talking to the
server through the raw SDK, so they hold for any client.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import re
import ssl
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from azure.cosmos import ContainerProxy, CosmosClient, DatabaseProxy, PartitionKey
from azure.cosmos import exceptions as cx

import celery_durable.stores.cosmos.store as cosmos_module
from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    DocumentTooLarge,
    StoreError,
    StoreUnavailable,
    Throttled,
)
from celery_durable.stores import MAX_DOC_BYTES, DueRef, Op, store_from_url
from celery_durable.stores.base import doc_size
from celery_durable.stores.cosmos.store import CosmosStore, from_url
from celery_durable.stores.offload.store import Offloading
from celery_durable.testing.cosmos_server import CosmosTestServer

pytestmark = pytest.mark.cosmos


@pytest.fixture
def store(cosmos_url: str) -> Iterator[CosmosStore]:
    s = store_from_url(cosmos_url)
    assert isinstance(s, CosmosStore)
    yield s
    s.close()


@pytest.fixture
def raw_db(cosmos_server: CosmosTestServer) -> Iterator[DatabaseProxy]:
    """The SDK without our store, for checking the server itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = CosmosClient(cosmos_server.endpoint, credential=cosmos_server.key, connection_verify=False)
        yield client.create_database_if_not_exists("raw_checks")
        client.close()


def new_container(db: DatabaseProxy, path: str = "/pk", **kwargs: Any) -> ContainerProxy:
    container: ContainerProxy = db.create_container(
        f"c{uuid.uuid4().hex[:12]}", partition_key=PartitionKey(path=path), **kwargs
    )
    return container


def doc_ops(server: CosmosTestServer) -> dict[str, int]:
    """Document requests served since the last reset (other clients' account refreshes left out)."""
    return {op: n for op, n in server.stats()["ops"].items() if op != "other"}


def sized(pk: str, doc_id: str, size: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"pk": pk, "id": doc_id, "blob": ""}
    doc["blob"] = "x" * (size - doc_size(doc))
    return doc


# --- deviations of the server, corrected in cosmos_server.js ------------------------------------


def test_deviation_point_read_of_missing_item_is_404(raw_db: DatabaseProxy, store: CosmosStore) -> None:
    c = new_container(raw_db)
    c.create_item({"pk": "p", "id": "there"})
    with pytest.raises(cx.CosmosResourceNotFoundError):
        c.read_item("missing", partition_key="p")
    with pytest.raises(cx.CosmosResourceNotFoundError):  # right id, wrong partition
        c.read_item("there", partition_key="q")
    assert store.read("p", "missing") is None


def test_deviation_partition_key_path_underscore_partition_key(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db, path="/_partitionKey")
    c.create_item({"_partitionKey": "a", "id": "x", "v": 1})
    c.create_item({"_partitionKey": "b", "id": "x", "v": 2})  # unpatched: 409, partitioned by id
    assert c.read_item("x", partition_key="a")["v"] == 1
    assert c.read_item("x", partition_key="b")["v"] == 2
    assert [d["v"] for d in c.query_items("SELECT * FROM c", partition_key="b")] == [2]


def test_deviation_batch_runs_every_op_in_the_header_partition(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    etag = c.create_item({"pk": "p", "id": "a", "v": 1})["_etag"]
    c.create_item({"pk": "p", "id": "gone"})
    results = c.execute_item_batch(
        [
            ("replace", ("a", {"pk": "p", "id": "a", "v": 2}), {"if_match_etag": etag}),
            ("upsert", ({"pk": "p", "id": "b", "v": 1},)),
            ("read", ("a",)),
            ("delete", ("gone",)),
            ("create", ({"pk": "p", "id": "c"},)),
        ],
        partition_key="p",
    )
    assert [r["statusCode"] for r in results] == [200, 201, 200, 204, 201]
    assert sorted(d["id"] for d in c.query_items("SELECT * FROM c", partition_key="p")) == ["a", "b", "c"]


def test_deviation_failed_batch_applies_nothing(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    etag = c.create_item({"pk": "p", "id": "a", "v": 1})["_etag"]
    c.create_item({"pk": "p", "id": "keep"})
    before = {d["id"]: d for d in c.query_items("SELECT * FROM c", partition_key="p")}
    with pytest.raises(cx.CosmosBatchOperationError) as info:
        c.execute_item_batch(
            [
                ("create", ({"pk": "p", "id": "new"},)),
                ("replace", ("a", {"pk": "p", "id": "a", "v": 2}), {"if_match_etag": etag}),
                ("delete", ("keep",)),
                ("replace", ("a", {"pk": "p", "id": "a", "v": 3}), {"if_match_etag": etag}),  # stale now
            ],
            partition_key="p",
        )
    assert info.value.error_index == 3 and info.value.status_code == 412
    assert [r["statusCode"] for r in info.value.operation_responses] == [424, 424, 424, 412]
    after = {d["id"]: d for d in c.query_items("SELECT * FROM c", partition_key="p")}
    assert after == before  # same items, same etags


def test_deviation_batch_limits(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    with pytest.raises(cx.CosmosHttpResponseError) as info:
        c.execute_item_batch([("create", ({"pk": "p", "id": f"d{i}"},)) for i in range(101)], partition_key="p")
    assert info.value.status_code == 400
    with pytest.raises(cx.CosmosBatchOperationError) as batch_info:  # an op outside the partition
        c.execute_item_batch([("create", ({"pk": "other", "id": "x"},))], partition_key="p")
    assert batch_info.value.status_code == 400
    assert list(c.query_items("SELECT * FROM c", enable_cross_partition_query=True)) == []


def test_deviation_query_with_partition_key_only_in_the_header(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    for pk in ("p", "q"):
        c.create_item({"pk": pk, "id": "a", "v": pk})
    assert [d["v"] for d in c.query_items("SELECT * FROM c", partition_key="p")] == ["p"]
    # with the key in WHERE but the header naming another partition: the header wins, as in Cosmos
    sql = "SELECT * FROM c WHERE c.pk = 'q'"
    assert list(c.query_items(sql, partition_key="p")) == []


def test_deviation_ttl(raw_db: DatabaseProxy) -> None:
    expiring = new_container(raw_db, default_ttl=1)
    expiring.create_item({"pk": "p", "id": "default"})
    expiring.create_item({"pk": "p", "id": "forever", "ttl": -1})
    opt_in = new_container(raw_db, default_ttl=-1)  # no default expiry; items opt in
    opt_in.create_item({"pk": "p", "id": "short", "ttl": 1})
    opt_in.create_item({"pk": "p", "id": "plain"})
    off = new_container(raw_db)  # TTL off: item ttl ignored
    off.create_item({"pk": "p", "id": "ignored", "ttl": 1})
    time.sleep(2.3)

    def ids(c: ContainerProxy) -> list[str]:
        return sorted(d["id"] for d in c.query_items("SELECT * FROM c", partition_key="p"))

    assert ids(expiring) == ["forever"]
    assert ids(opt_in) == ["plain"]
    assert ids(off) == ["ignored"]
    with pytest.raises(cx.CosmosResourceNotFoundError):
        expiring.read_item("default", partition_key="p")


def test_deviation_replace_container_keeps_items(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    c.create_item({"pk": "p", "id": "a"})
    raw_db.replace_container(c, partition_key=PartitionKey(path="/pk"), default_ttl=3600)
    assert c.read()["defaultTtl"] == 3600
    assert [d["id"] for d in c.query_items("SELECT * FROM c", partition_key="p")] == ["a"]
    c.create_item({"pk": "p", "id": "b"})
    assert c.read_item("b", partition_key="p")["id"] == "b"


def test_deviation_unsupported_query_syntax_is_avoided(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    for sql in (
        "SELECT * FROM c OFFSET 0 LIMIT 1",
        "SELECT DISTINCT c.pk FROM c",
        "SELECT c.pk, COUNT(1) AS n FROM c GROUP BY c.pk",
    ):
        with pytest.raises(cx.CosmosHttpResponseError) as info:  # still unsupported by the server...
            list(c.query_items(sql, enable_cross_partition_query=True))
        assert info.value.status_code == 400
    # ...so the store must not use them
    source = Path(cosmos_module.__file__).read_text()
    assert not re.search(r"\b(OFFSET|LIMIT|DISTINCT|GROUP BY)\b", source)


def test_deviation_items_over_2_mb_are_413(raw_db: DatabaseProxy) -> None:
    c = new_container(raw_db)
    c.create_item(sized("p", "fits", MAX_DOC_BYTES - 200))
    with pytest.raises(cx.CosmosHttpResponseError) as info:
        c.create_item(sized("p", "big", MAX_DOC_BYTES + 1))
    assert info.value.status_code == 413
    with pytest.raises(cx.CosmosHttpResponseError) as info:
        c.upsert_item(sized("p", "fits", MAX_DOC_BYTES + 1))
    assert info.value.status_code == 413


def test_deviation_connections_are_kept_alive(cosmos_server: CosmosTestServer) -> None:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", cosmos_server.port, context=ssl._create_unverified_context(), timeout=10
    )
    try:
        for _ in range(3):
            conn.request("GET", "/")  # the account endpoint needs no auth on this server
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200 and resp.getheader("connection") == "keep-alive"
        assert conn.sock is not None  # one socket served all three
    finally:
        conn.close()


# --- the store under throttling and outages ----------------------------------------------------------


def test_429_is_retried_honouring_retry_after(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    store.create({"pk": "p", "id": "a", "v": 1})
    cosmos_server.reset_stats()
    cosmos_server.inject_fault(429, count=3, retry_after_ms=300)
    started = time.monotonic()
    got = store.read("p", "a")
    elapsed = time.monotonic() - started
    assert got is not None and got["v"] == 1
    assert 0.9 <= elapsed < 5, elapsed  # waited the server's 3 x 300 ms, not a blind backoff
    stats = cosmos_server.stats()
    assert stats["faults"] == 3 and stats["ops"]["read"] == 1


def test_429_beyond_the_retry_budget_raises_throttled(cosmos_url: str, cosmos_server: CosmosTestServer) -> None:
    store = store_from_url(cosmos_url + "&throttle_retries=2")
    store.create({"pk": "p", "id": "a"})
    cosmos_server.inject_fault(429, count=50, retry_after_ms=40)
    with pytest.raises(Throttled) as info:
        store.read("p", "a")
    assert info.value.retry_after == pytest.approx(0.04)
    assert isinstance(info.value, StoreUnavailable)
    assert isinstance(info.value.__cause__, cx.CosmosHttpResponseError)  # translated, not leaked
    cosmos_server.clear_faults()
    assert store.read("p", "a") is not None


def test_503_is_retried_then_reported_unavailable(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    store.create({"pk": "p", "id": "a"})
    cosmos_server.inject_fault(503, count=1)
    assert store.create({"pk": "p", "id": "b"}) is not None  # 503: not applied, safe to retry
    cosmos_server.inject_fault(503, count=100)
    with pytest.raises(StoreUnavailable) as info:
        store.read("p", "a")
    assert "503" in str(info.value) and not isinstance(info.value, Throttled)


def test_read_many_maps_errors_like_read(cosmos_url: str, cosmos_server: CosmosTestServer) -> None:
    """One query, so the query's retries and translation: 429/503 retried, then Throttled/StoreUnavailable."""
    store = store_from_url(cosmos_url + "&throttle_retries=2")
    store.create({"pk": "p", "id": "a", "v": 1})
    query = "^POST_QUERY /dbs/.*/docs"
    cosmos_server.reset_stats()
    cosmos_server.inject_fault(429, count=2, retry_after_ms=40, match=query)
    cosmos_server.inject_fault(503, count=1, match=query)
    assert [d and d["v"] for d in store.read_many("p", ["a", "b"])] == [1, None]  # all retried
    assert cosmos_server.stats()["faults"] == 3
    cosmos_server.inject_fault(0, drop=True, count=1, match=query)  # a read: safe to send again
    assert [d and d["v"] for d in store.read_many("p", ["a"])] == [1]
    assert cosmos_server.stats()["faults"] == 4
    cosmos_server.inject_fault(429, count=50, retry_after_ms=40, match=query)
    with pytest.raises(Throttled) as throttled:
        store.read_many("p", ["a"])
    assert throttled.value.retry_after == pytest.approx(0.04)
    assert isinstance(throttled.value.__cause__, cx.CosmosHttpResponseError)  # translated, not leaked
    cosmos_server.clear_faults()
    cosmos_server.inject_fault(503, count=100, match=query)
    with pytest.raises(StoreUnavailable) as unavailable:
        store.read_many("p", ["a"])
    assert "503" in str(unavailable.value) and "read_many" in str(unavailable.value)
    assert not isinstance(unavailable.value, Throttled)
    cosmos_server.clear_faults()
    cosmos_server.pause()
    try:
        with pytest.raises(StoreUnavailable):
            store.read_many("p", ["a"])
    finally:
        cosmos_server.resume()
    assert [d and d["v"] for d in store.read_many("p", ["a"])] == [1]


def test_read_many_refuses_an_id_too_long_like_read(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    too_long = "x" * 1100
    with pytest.raises(ConfigurationError) as by_read:
        store.read("p", too_long)
    cosmos_server.reset_stats()
    with pytest.raises(ConfigurationError) as by_many:
        store.read_many("p", ["a", too_long])
    assert str(by_many.value) == str(by_read.value)
    assert cosmos_server.stats()["total"] == 0  # refused before sending anything


def test_dropped_connection_retries_reads_but_not_creates(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    store.create({"pk": "p", "id": "a"})
    cosmos_server.inject_fault(0, drop=True, count=1, match="^GET /dbs/.*/docs/")
    assert store.read("p", "a") is not None
    # a create cut off after sending may have run: retrying could turn our win into a 409
    cosmos_server.inject_fault(0, drop=True, count=1, match="^POST /dbs/.*/docs")
    with pytest.raises(StoreUnavailable):
        store.create({"pk": "p", "id": "b"})


def test_outage_gives_store_unavailable_then_recovers(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    etag = store.create({"pk": "p", "id": "a", "v": 1})
    cosmos_server.pause()
    try:
        for call in (
            lambda: store.read("p", "a"),
            lambda: store.create({"pk": "p", "id": "b"}),
            lambda: store.query_partition("p"),
            lambda: store.scan_due("clock", time.time()),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - started < 15
    finally:
        cosmos_server.resume()
    got = store.read("p", "a")  # same port, data intact
    assert got is not None and got["_etag"] == etag
    cosmos_server.restart(downtime=0.3)
    assert store.replace({"pk": "p", "id": "a", "v": 2}, if_match=etag)


def test_stopped_server_gives_store_unavailable(cosmos_server: CosmosTestServer) -> None:
    server = CosmosTestServer().start()  # our own: this one gets stopped (the fixture checked Node works)
    try:
        url = server.url_for("db", "c")
        store = store_from_url(url)
        store.create({"pk": "p", "id": "a"})
        server.stop()
        with pytest.raises(StoreUnavailable) as info:
            store.read("p", "a")
        assert isinstance(info.value.__cause__, Exception) and not isinstance(info.value, ConflictError)
        fresh = store_from_url(url)  # connecting to nothing
        with pytest.raises(StoreUnavailable):
            fresh.read("p", "a")
        server.start()  # same port, new (empty) process
        assert store.read("p", "a") is None
    finally:
        server.stop()


# --- secrets ---------------------------------------------------------------------------------------


def _all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.__cause__)


def test_key_never_in_logs_errors_or_repr(
    cosmos_url: str, cosmos_server: CosmosTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = cosmos_server.key
    forms = {key, quote(key, safe=""), quote_plus(key)}
    texts: list[str] = []
    # the SDK's request loggers are quiet by default (WARNING): turn them on, they print headers
    http_logs = ("azure.cosmos._cosmos_http_logging_policy", "azure.core.pipeline.policies.http_logging_policy")
    for name in (None, "azure", "azure.cosmos", "azure.core", "urllib3", *http_logs):  # restored by caplog
        caplog.set_level(logging.DEBUG, logger=name)
    store = store_from_url(cosmos_url + "&throttle_retries=1&retries=1")
    texts += [repr(store), str(store), repr(vars(store))]
    etag = store.create({"pk": "p", "id": "a", "due_kind": "clock", "due_at": time.time() - 5})
    assert etag
    store.replace({"pk": "p", "id": "a", "v": 2}, if_match=etag)
    store.scan_due("clock", time.time())
    failures: list[Any] = [
        lambda: store.replace({"pk": "p", "id": "a"}, if_match=etag),  # 412
        lambda: store.batch("p", [Op.create({"pk": "p", "id": "a"})]),  # 409 in a batch
    ]
    for fail in failures:
        with pytest.raises(StoreError) as info:
            fail()
        texts.append(_all_text(info.value))
    cosmos_server.inject_fault(429, count=10, retry_after_ms=10)
    with pytest.raises(Throttled) as throttled:
        store.read("p", "a")
    texts.append(_all_text(throttled.value))
    cosmos_server.clear_faults()
    cosmos_server.pause()
    try:
        with pytest.raises(StoreUnavailable) as down:
            store.read("p", "a")
        texts.append(_all_text(down.value))
    finally:
        cosmos_server.resume()
    for bad in (
        cosmos_url.replace("database=", "databaze="),
        cosmos_url + "&bogus=1",
        cosmos_server.url_for("durable_tests", "does-not-exist", create=False),
    ):
        with pytest.raises(ConfigurationError) as conf:
            store_from_url(bad).read("p", "a")
        texts.append(_all_text(conf.value))
    texts.append(caplog.text)
    assert caplog.records  # the SDK did log at DEBUG
    joined = "\n".join(texts)
    for form in forms:
        assert form not in joined
    assert "type%3dmaster" not in joined.lower()  # no request signature either


def test_key_from_environment_and_url_redaction(cosmos_server: CosmosTestServer, monkeypatch: Any) -> None:
    url = cosmos_server.url_for("durable_tests", "envkey").replace(quote(cosmos_server.key, safe=""), "")
    url = url.replace("&key=", "")
    monkeypatch.delenv("DURABLE_COSMOS_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="needs a key"):
        from_url(url)
    monkeypatch.setenv("DURABLE_COSMOS_KEY", cosmos_server.key)
    store = from_url(url)
    assert store.create({"pk": "p", "id": "a"}) is not None
    assert cosmos_server.key not in repr(store)
    # an unencoded base64 key in the URL ("+" would arrive as a space) still works
    monkeypatch.delenv("DURABLE_COSMOS_KEY")
    raw = from_url(url + "&key=" + cosmos_server.key)
    assert raw.read("p", "a") is not None


# --- ids, sizes, configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc_id",
    ["a/b", "c#d", "e?f=1", "g\\h", "ünïcødé-日本-🙂", "~looks-encoded", "with space", "%2F", "x" * 300],
)
def test_illegal_ids_are_encoded_reversibly(store: CosmosStore, raw_db: DatabaseProxy, doc_id: str) -> None:
    etag = store.create({"pk": "p/#?\\", "id": doc_id, "v": 1})
    assert etag is not None
    assert store.create({"pk": "p/#?\\", "id": doc_id, "v": 2}) is None
    got = store.read("p/#?\\", doc_id)
    assert got is not None and got["id"] == doc_id and got["v"] == 1
    assert [d["id"] for d in store.query_partition("p/#?\\").docs] == [doc_id]
    assert store.batch("p/#?\\", [Op.replace({"pk": "p/#?\\", "id": doc_id, "v": 3}, etag)])
    assert store.delete("p/#?\\", doc_id) is True
    # and what Cosmos stored is a legal id
    for item in store._container().query_items("SELECT * FROM c", enable_cross_partition_query=True):
        assert not set(item["id"]) & set("/\\?#") and len(item["id"]) <= 1023


def test_size_limit_is_checked_before_sending(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    # the backend's own check (stores built by store_from_url offload a bigger document into
    # chunks above it: tests/stores/test_contract_large.py)
    raw = store.backend if isinstance(store, Offloading) else store
    store.create({"pk": "p", "id": "warm"})
    cosmos_server.reset_stats()
    with pytest.raises(DocumentTooLarge) as info:
        raw.create(sized("p", "big", MAX_DOC_BYTES + 1))
    assert info.value.size == MAX_DOC_BYTES + 1 and info.value.limit == MAX_DOC_BYTES
    assert cosmos_server.stats()["total"] == 0
    assert raw.create(sized("p", "fits", MAX_DOC_BYTES - 100)) is not None


def test_server_413_maps_to_document_too_large(store: CosmosStore, monkeypatch: Any) -> None:
    monkeypatch.setattr(store, "max_doc_bytes", 3 * MAX_DOC_BYTES)  # let it through to the server
    with pytest.raises(DocumentTooLarge) as info:
        store.upsert(sized("p", "big", MAX_DOC_BYTES + 10))
    assert info.value.doc_id == "big" and info.value.limit == 3 * MAX_DOC_BYTES


def test_container_with_another_partition_key_is_refused(
    raw_db: DatabaseProxy, cosmos_server: CosmosTestServer
) -> None:
    c = new_container(raw_db, path="/id")
    store = store_from_url(cosmos_server.url_for("raw_checks", c.id))
    with pytest.raises(ConfigurationError, match="partitioned by"):
        store.read("p", "a")


def test_url_options(cosmos_server: CosmosTestServer) -> None:
    store = from_url(
        f"cosmos://127.0.0.1:{cosmos_server.port}/durable_tests/pathform?verify=false&key={quote(cosmos_server.key)}"
        "&retries=1&timeout=5&due_bucket=30&discovery=false&consistency=Session"
    )
    assert (store.database, store.container, store.index.bucket) == ("durable_tests", "pathform", 30.0)
    assert store.create({"pk": "p", "id": "a"}) is not None
    for bad in ("cosmos:///?database=d&container=c", "cosmos://h/?database=d", "cosmos://h/d/c?verify=maybe"):
        with pytest.raises(ConfigurationError):
            from_url(bad, key="k")


def test_reopen_drops_the_client(store: CosmosStore) -> None:
    store.create({"pk": "p", "id": "a"})
    old = store._client
    store.reopen()
    assert store._client is None and store._proxy is None
    assert store.read("p", "a") is not None and store._client is not old


def test_close_leaves_no_sdk_thread_running(cosmos_url: str, cosmos_server: CosmosTestServer) -> None:
    """A worker's main process opens the store to check it, closes it, then forks its pool. The
    SDK starts a background endpoint health check (a thread and a pool, making TLS connections)
    that the SDK's own close() leaves running; a child forked while one is inside OpenSSL inherits
    its locks held and hangs at its first TLS connection (seen: SSL_CTX_new, for ever). So close()
    waits for them: here the health check is slowed down so it is surely in flight."""
    before = set(threading.enumerate())
    # the client's own account read passes (a no-op fault), its background health check (the
    # next GET /) takes 3 s: surely in flight when close() is called
    cosmos_server.inject_fault(0, count=1, match=r"^GET /$")
    cosmos_server.inject_fault(0, count=1, delay_ms=3000, match=r"^GET /$")
    store = store_from_url(cosmos_url)
    assert store.read("p", "missing") is None
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert any(t.name == "cosmos-endpoint-refresh" for t in started), [t.name for t in started]
    store.close()
    left = [t.name for t in started if t.is_alive()]
    assert left == [], f"SDK threads still running after close(): {left}"


def test_reopen_after_fork_does_not_wait_for_a_lock_a_parent_thread_held() -> None:
    """A thread of the parent was inside a store call (holding the session-token map's lock) when
    the process forked: the child's reopened store must not wait for a thread it does not have."""
    store = CosmosStore("https://127.0.0.1:9", "db", "c", key="a2V5")  # never connects here
    store.use_session_token("p", "0:1#5")
    held, release = threading.Event(), threading.Event()

    def in_a_store_call() -> None:
        with store._sessions._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=in_a_store_call)
    thread.start()
    assert held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 if the token was read, 3 if that hung
            answered = threading.Event()
            try:
                store.reopen()
                threading.Thread(target=lambda: store.session_token("p") and answered.set(), daemon=True).start()
                answered.wait(3)
            finally:
                os._exit(0 if answered.is_set() else 3)
    finally:
        release.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's session-token map stayed locked"
    assert store.session_token("p") == "0:1#5"


# --- the due index ---------------------------------------------------------------------------------


def test_scan_due_cost_grows_with_what_is_due_not_with_history(
    store: CosmosStore, cosmos_server: CosmosTestServer
) -> None:
    now = time.time()
    for i in range(300):  # history: never due
        store.create({"pk": f"w{i}", "id": "exec", "status": "completed"})
    handled = [store.create({"pk": f"h{i}", "id": "clock", "due_kind": "clock", "due_at": now - 30}) for i in range(40)]
    assert len(store.scan_due("clock", now, limit=1000)) == 40
    time.sleep(1.1)  # the handler's writes land in a later second than the index entries
    for i, etag in enumerate(handled):
        assert etag is not None
        store.replace({"pk": f"h{i}", "id": "clock", "fired": True}, if_match=etag)
    for i in range(3):
        store.create({"pk": f"d{i}", "id": "clock", "due_kind": "clock", "due_at": now - i})
    store.scan_due("clock", now)  # drops the 40 stale entries
    cosmos_server.reset_stats()
    due = store.scan_due("clock", now)
    assert [r.pk for r in due] == ["d2", "d1", "d0"]
    stats = cosmos_server.stats()
    assert stats["ops"].get("read") == 3  # one point read per due document
    assert stats["ops"].get("query", 0) <= 6  # the late partition + the buckets since the low-water mark
    assert stats["queryDocs"] == 3  # their 3 index entries: nothing of the history
    assert not stats["ops"].get("create") and not stats["ops"].get("delete")


def test_lease_pushed_later_costs_no_index_write(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    now = time.time()
    etag = store.create({"pk": "w", "id": "exec", "due_kind": "lease", "due_at": now + 60})
    assert etag is not None
    cosmos_server.reset_stats()
    for step in (10, 20, 30):  # heartbeats
        etag = store.replace({"pk": "w", "id": "exec", "due_kind": "lease", "due_at": now + 60 + step}, if_match=etag)
    assert doc_ops(cosmos_server) == {"replace": 3}
    etag = store.replace({"pk": "w", "id": "exec", "due_kind": "lease", "due_at": now + 30}, if_match=etag)
    etag = store.replace({"pk": "w", "id": "exec", "due_kind": "wake", "due_at": now + 30}, if_match=etag)
    assert doc_ops(cosmos_server) == {"replace": 5, "upsert": 2}  # earlier, new kind: new entries
    assert store.scan_due("lease", now + 1000) == []
    assert store.scan_due("wake", now + 31) == [DueRef("w", "exec", now + 30)]


def test_scan_due_after_a_long_downtime(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    now = time.time()
    hours = [1, 5, 30, 70]
    for h in hours:
        store.create({"pk": f"t{h}", "id": "clock", "due_kind": "clock", "due_at": now + 3600 * h})
    store.create({"pk": "old", "id": "clock", "due_kind": "clock", "due_at": now - 7 * 86400})
    assert [r.pk for r in store.scan_due("clock", now)] == ["old"]
    cosmos_server.reset_stats()
    later = now + 3 * 86400  # the scanner was down for three days (4,320 one-minute buckets)
    assert [r.pk for r in store.scan_due("clock", later)] == ["old"] + [f"t{h}" for h in hours]
    assert cosmos_server.stats()["ops"]["query"] < 40


def test_a_fresh_scanner_finds_old_buckets(cosmos_url: str) -> None:
    writer = store_from_url(cosmos_url)
    now = time.time()
    writer.create({"pk": "w", "id": "clock", "due_kind": "clock", "due_at": now + 5})
    scanner = store_from_url(cosmos_url)  # no low-water mark yet, in memory or stored
    assert scanner.scan_due("clock", now + 10) == [DueRef("w", "clock", now + 5)]
    assert scanner.scan_due("clock", now) == []


def test_stuck_due_entries_do_not_hold_back_the_mark(store: CosmosStore, cosmos_server: CosmosTestServer) -> None:
    now = time.time()
    store.create({"pk": "s", "id": "clock", "due_kind": "clock", "due_at": now})
    store.index = store.index.__class__(stuck_buckets=-1)  # everything counts as stuck
    assert store.scan_due("clock", now + 1) == [DueRef("s", "clock", now)]
    # the entry moved to the always-scanned late partition and is still reported
    cosmos_server.reset_stats()
    assert store.scan_due("clock", now + 1) == [DueRef("s", "clock", now)]


@pytest.mark.foreign_documents  # a store test's own documents, not the engine's
def test_index_stays_complete_under_concurrent_writers_and_scanners(cosmos_url: str) -> None:
    """Writers move due times around (later, earlier, other kind, none) while scanners clean up:
    afterwards a scan still finds exactly the documents that are due."""
    import random
    import threading

    stores = [store_from_url(cosmos_url) for _ in range(3)]
    base = time.time()
    ids = [(f"w{i}", "exec") for i in range(12)]
    for pk, doc_id in ids:
        stores[0].create({"pk": pk, "id": doc_id, "due_kind": "lease", "due_at": base + 30})
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng, store = random.Random(seed), stores[seed % 2]
        try:
            for _ in range(40):
                pk, doc_id = rng.choice(ids)
                got = store.read(pk, doc_id)
                assert got is not None
                doc = {"pk": pk, "id": doc_id, "n": rng.random()}
                choice = rng.random()
                if choice < 0.8:  # mostly push the lease around, sometimes switch kind
                    doc["due_kind"] = "lease" if choice < 0.65 else "wake"
                    doc["due_at"] = time.time() + rng.uniform(-90, 90)
                with contextlib.suppress(ConflictError):
                    store.replace(doc, if_match=got["_etag"])
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    def scanner() -> None:
        try:
            while not stop.is_set():
                for kind in ("lease", "wake"):
                    stores[2].scan_due(kind, time.time() + random.uniform(-60, 60))
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)] + [threading.Thread(target=scanner)]
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join(timeout=120)
    stop.set()
    threads[-1].join(timeout=60)
    assert not errors, errors
    docs = [stores[0].read(pk, doc_id) for pk, doc_id in ids]
    far = time.time() + 200
    for kind in ("lease", "wake"):
        expected = sorted((d["due_at"], d["pk"]) for d in docs if d and d.get("due_kind") == kind)
        got = store_from_url(cosmos_url).scan_due(kind, far, limit=1000)  # a fresh scanner too
        assert sorted((r.due_at, r.pk) for r in got) == expected
        assert sorted((r.due_at, r.pk) for r in stores[2].scan_due(kind, far, limit=1000)) == expected


# --- pure helpers ------------------------------------------------------------------------------


def test_id_encoding_is_injective_and_legal() -> None:
    from celery_durable.stores.cosmos.index import encode_id

    samples = ["abc", "a/b", "~a", "~" + encode_id("a/b")[1:], "a b", "ü", "exec", "act:charge_card:1", "%41"]
    encoded = [encode_id(s) for s in samples]
    assert len(set(encoded)) == len(samples)
    assert encode_id("exec") == "exec" and encode_id("act:charge_card:1") == "act:charge_card:1"
    assert all(not set(e) & set("/\\?#") for e in encoded)


def test_etag_carries_the_due_reference() -> None:
    from celery_durable.stores.cosmos.index import make_etag, split_etag

    assert split_etag("abc") == ("abc", None)
    ref = ["lease", 1700000000.25, 28333333]
    assert split_etag(make_etag('"00-11"', ref)) == ('"00-11"', ref)
    assert split_etag("x|not-base64!") == ("x|not-base64!", None)


def test_trust_rule() -> None:
    from celery_durable.stores.cosmos.index import DueIndex

    ix, now = DueIndex(), 1_000_000.0
    prev = ["lease", now + 60, ix.bucket_of(now + 60)]
    assert ix.trusted(prev, "lease", now + 70, now)  # pushed later: the old entry still covers it
    assert not ix.trusted(prev, "lease", now + 50, now)  # earlier: needs its own entry
    assert not ix.trusted(prev, "wake", now + 70, now)  # other kind
    assert not ix.trusted(prev, "lease", now + 60 + ix.trust_slack + 1, now)  # too far: bounds re-checks
    assert not ix.trusted(["lease", now + 1, 0], "lease", now + 10, now)  # entry about to fire
    assert not ix.trusted(None, "lease", now + 70, now)


def test_a_fresh_scanner_evaluates_the_index_entries_not_the_container(
    cosmos_url: str, store: CosmosStore, cosmos_server: CosmosTestServer
) -> None:
    """Issue 28: the first scan_due of a process (no low-water mark known: a cross-partition
    query for the oldest bucket, then each bucket's shards) evaluated every item of the
    container on the test server (45 s over 60,000, past the 10 s deadline), where Cosmos
    answers from its index. It must see the due index's entries only, whatever history the
    container holds."""
    now = time.time()
    for i in range(400):  # history: never due
        store.create({"pk": f"w{i}", "id": "exec", "status": "completed"})
    for i in range(3):
        store.create({"pk": f"d{i}", "id": "clock", "due_kind": "clock", "due_at": now - 120 + i})
    from celery_durable.stores import store_from_url

    fresh = store_from_url(cosmos_url)  # a new process's store: no low-water mark known
    try:
        cosmos_server.reset_stats()
        due = fresh.scan_due("clock", now)
        assert sorted(r.pk for r in due) == ["d0", "d1", "d2"]
        stats = cosmos_server.stats()
        assert stats["queryScanned"] <= 20, stats  # index entries and marks, not 400 histories
    finally:
        fresh.close()
