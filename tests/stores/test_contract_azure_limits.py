"""Contract limits taken from Azure Cosmos DB, enforced by every backend alike (issue 16).

A transactional batch carries at most 2 MB in all (``MAX_BATCH_BYTES``, counted by
``batch_bytes``); a partition key value is at most 2,048 bytes; ``scan_due`` takes any ``now``,
infinity included. The offloading layer keeps every batch it sends under the byte limit.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from celery_durable.errors import ConfigurationError, DocumentTooLarge
from celery_durable.stores import Doc, DueRef, Op, Store
from celery_durable.stores.base import MAX_BATCH_BYTES, MAX_DOC_BYTES, MAX_PK_BYTES, batch_bytes, doc_size
from celery_durable.stores.offload.store import Offloading

MB = 1024 * 1024
T0 = float(int(time.time()))


def D(pk: str, doc_id: str, **fields: Any) -> Doc:
    return {"pk": pk, "id": doc_id, **fields}


def sized(pk: str, doc_id: str, size: int) -> Doc:
    doc = D(pk, doc_id, blob="")
    doc["blob"] = "x" * (size - doc_size(doc))
    assert doc_size(doc) == size
    return doc


def raw(store: Store) -> Store:
    """The backend underneath the offloading layer (its batch sends what it is given)."""
    assert isinstance(store, Offloading)
    return store.backend


# --- batch bytes -------------------------------------------------------------------------------


def test_a_batch_over_the_byte_limit_is_refused_by_every_backend_and_applies_nothing(store: Store) -> None:
    backend = raw(store)
    backend.create(D("p", "keep", v=1))
    ops = [Op.create(sized("p", "a", int(1.5 * MB))), Op.create(sized("p", "b", int(1.5 * MB)))]
    with pytest.raises(DocumentTooLarge) as info:
        backend.batch("p", ops)
    assert info.value.limit == MAX_BATCH_BYTES and info.value.size > MAX_BATCH_BYTES
    assert "batch of 2 operations" in str(info.value)
    assert sorted(d["id"] for d in backend.query_partition("p").docs) == ["keep"]


def test_a_batch_at_the_byte_limit_is_accepted_by_every_backend(store: Store) -> None:
    backend = raw(store)
    # two documents (each under the item limit) whose batch is exactly at the limit as counted
    first = sized("p", "a", MAX_DOC_BYTES - 4096)
    room = MAX_BATCH_BYTES - batch_bytes([Op.create(first), Op.create(D("p", "b"))], [doc_size(first), 0])
    second = sized("p", "b", room)
    ops = [Op.create(first), Op.create(second)]
    assert batch_bytes(ops, [doc_size(first), doc_size(second)]) == MAX_BATCH_BYTES
    assert all(e is not None for e in backend.batch("p", ops))
    got = backend.read("p", "b")
    assert got is not None and got["blob"] == second["blob"]


def test_the_offloading_store_keeps_a_big_batch_under_the_limit(store: Store) -> None:
    # two 1.5 MB documents: each fits the item limit (inline), together they pass the batch limit
    a, b = sized("p", "a", int(1.5 * MB)), sized("p", "b", int(1.5 * MB))
    etags = store.batch("p", [Op.create(a), Op.upsert(b), Op.create(D("p", "small", v=1))])
    assert all(e is not None for e in etags)
    assert store.read("p", "a")["blob"] == a["blob"]  # type: ignore[index]
    assert store.read("p", "b")["blob"] == b["blob"]  # type: ignore[index]
    # and they can be replaced together with their etags (the replaced chunks go)
    a2, b2 = sized("p", "a", int(1.2 * MB)), sized("p", "b", int(1.9 * MB))
    store.batch("p", [Op.replace(a2, if_match=etags[0]), Op.replace(b2, if_match=etags[1])])
    docs = {d["id"]: d for d in store.query_partition("p").docs}
    assert sorted(docs) == ["a", "b", "small"]
    assert docs["a"]["blob"] == a2["blob"] and docs["b"]["blob"] == b2["blob"]
    # what the backend holds: every document and every batch it was sent stayed within its limits
    for d in raw(store).query_partition("p").docs:
        assert doc_size({k: v for k, v in d.items() if k != "_etag"}) <= MAX_DOC_BYTES


# --- partition key length ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["create", "replace", "upsert", "batch"])
def test_a_partition_key_over_2048_bytes_is_refused_alike(store: Store, how: str) -> None:
    longest = "k" * (MAX_PK_BYTES - 2) + "é"  # 2,048 bytes, 2,047 characters
    assert store.create(D(longest, "d", v=1)) is not None
    assert store.read(longest, "d")["v"] == 1  # type: ignore[index]
    too_long = "k" * (MAX_PK_BYTES - 1) + "é"  # 2,049 bytes
    doc = D(too_long, "d", v=2)
    with pytest.raises(ConfigurationError, match="partition key"):
        if how == "create":
            store.create(doc)
        elif how == "replace":
            store.replace(doc, if_match=None)
        elif how == "upsert":
            store.upsert(doc)
        else:
            store.batch(too_long, [Op.create(doc)])
    assert store.read(too_long, "d") is None


# --- scan_due with an unbounded now -----------------------------------------------------------


def test_scan_due_until_infinity_returns_everything_due(store: Store) -> None:
    store.create(D("e1", "soon", due_kind="clock", due_at=T0 - 5))
    store.create(D("e2", "later", due_kind="clock", due_at=T0 + 3600))
    store.create(D("e3", "far", due_kind="clock", due_at=1e12))
    store.create(D("e4", "other", due_kind="lease", due_at=T0))
    got = store.scan_due("clock", math.inf)
    assert got == [DueRef("e1", "soon", T0 - 5), DueRef("e2", "later", T0 + 3600), DueRef("e3", "far", 1e12)]
    assert store.scan_due("clock", T0) == [DueRef("e1", "soon", T0 - 5)]  # and the scanner still works
    assert store.scan_due("clock", -math.inf) == []
