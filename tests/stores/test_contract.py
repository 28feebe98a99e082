"""The storage contract (docs/architecture.md §4, ``celery_durable/stores/base.py``), one suite for every backend.

Every test gets a fresh empty store from the ``store`` fixture (tests/stores/conftest.py),
parametrized over ``memory``, ``sqlite`` and ``cosmos``. Backend-specific behaviour (SQLite
files, locks, fork) is at the end of the module.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    CorruptDocument,
    DocumentTooLarge,
    StoreUnavailable,
)
from celery_durable.stores import MAX_BATCH_OPS, MAX_DOC_BYTES, Doc, DueRef, Op, Store, store_from_url
from celery_durable.stores.base import MAX_PAGE_SIZE, ExecFilter, doc_size
from celery_durable.stores.offload.store import Offloading

# epoch seconds near the real clock (a backend may bucket due times by wall-clock time)
T0 = float(int(time.time()))

AWKWARD_IDS = [
    "a/b/c",
    "hash#tag",
    "what?x=1&y=2",
    "back\\slash",
    "with space ",
    "ünïcødé-ß-日本語-🙂",
    "%2F-percent-encoded",
    "../dots/..",
]


def D(pk: str, doc_id: str, **fields: Any) -> Doc:
    return {"pk": pk, "id": doc_id, **fields}


def body(doc: Doc | None) -> Doc | None:
    """A document without the store's reserved keys."""
    return None if doc is None else {k: v for k, v in doc.items() if not k.startswith("_")}


def state(store: Store, pk: str) -> dict[str, Doc]:
    """Everything in a partition by id, etags included."""
    return {d["id"]: d for d in store.query_partition(pk).docs}


def run_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released together by a barrier; results (or exceptions) by i."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def target(i: int) -> None:
        barrier.wait(timeout=60)
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: B036 - reported to the test, not swallowed
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results


# --- read / create / replace / upsert / delete --------------------------------------------------


def test_read_missing_is_none(store: Store) -> None:
    assert store.read("p", "nope") is None
    store.create(D("p", "other"))
    assert store.read("p", "nope") is None
    assert store.read("other-partition", "other") is None


def test_create_then_read_round_trips_json(store: Store) -> None:
    doc = D(
        "p",
        "a",
        text="héllo wörld ✓",
        n=42,
        x=1.5,
        big=2**53,
        neg=-0.25,
        flag=True,
        off=False,
        nothing=None,
        items=[1, "two", {"three": [3.0]}],
        nested={"deep": {"deeper": {"k": "v"}}, "empty": {}, "list": []},
    )
    etag = store.create(doc)
    assert isinstance(etag, str) and etag
    got = store.read("p", "a")
    assert got is not None
    assert got["_etag"] == etag
    assert body(got) == doc


def test_create_existing_returns_none_and_keeps_the_first(store: Store) -> None:
    first = store.create(D("p", "a", v=1))
    assert first is not None
    assert store.create(D("p", "a", v=2)) is None
    got = store.read("p", "a")
    assert got is not None and got["v"] == 1 and got["_etag"] == first


def test_writes_ignore_etag_in_body(store: Store) -> None:
    etag = store.create(D("p", "a", v=1, _etag="bogus"))
    got = store.read("p", "a")
    assert got is not None and got["_etag"] == etag != "bogus"
    assert "bogus" not in got.values()
    etag2 = store.replace(dict(got, v=2, _etag="bogus2"), if_match=etag)
    got = store.read("p", "a")
    assert got is not None and got["_etag"] == etag2 != "bogus2" and got["v"] == 2
    etag3 = store.upsert(dict(got, v=3, _etag="bogus3"))
    got = store.read("p", "a")
    assert got is not None and got["_etag"] == etag3 != "bogus3" and got["v"] == 3


def test_read_returns_a_copy(store: Store) -> None:
    store.create(D("p", "a", items=[1], nested={"k": "v"}))
    got = store.read("p", "a")
    assert got is not None
    got["items"].append(2)
    got["nested"]["k"] = "changed"
    got["new"] = 1
    again = store.read("p", "a")
    assert body(again) == D("p", "a", items=[1], nested={"k": "v"})


def test_replace_with_current_etag(store: Store) -> None:
    etag = store.create(D("p", "a", v=1))
    new = store.replace(D("p", "a", v=2), if_match=etag)
    assert new != etag
    got = store.read("p", "a")
    assert got is not None and got["v"] == 2 and got["_etag"] == new


def test_replace_with_stale_etag_conflicts_and_changes_nothing(store: Store) -> None:
    old = store.create(D("p", "a", v=1))
    current = store.replace(D("p", "a", v=2), if_match=old)
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=3), if_match=old)
    got = store.read("p", "a")
    assert got is not None and got["v"] == 2 and got["_etag"] == current


def test_replace_with_unknown_etag_conflicts(store: Store) -> None:
    store.create(D("p", "a", v=1))
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=2), if_match="not-an-etag-of-this-store")
    assert store.read("p", "a") is not None and store.read("p", "a")["v"] == 1  # type: ignore[index]


def test_replace_without_etag_replaces_any_version(store: Store) -> None:
    store.create(D("p", "a", v=1))
    store.replace(D("p", "a", v=2), if_match=None)
    etag = store.replace(D("p", "a", v=3), if_match=None)
    got = store.read("p", "a")
    assert got is not None and got["v"] == 3 and got["_etag"] == etag


@pytest.mark.parametrize("if_match", [None, "1", "stale"])
def test_replace_missing_conflicts(store: Store, if_match: str | None) -> None:
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=1), if_match=if_match)
    assert store.read("p", "a") is None


def test_replace_of_deleted_doc_conflicts(store: Store) -> None:
    etag = store.create(D("p", "a"))
    assert store.delete("p", "a") is True
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=2), if_match=etag)
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=2), if_match=None)
    assert store.read("p", "a") is None


def test_etag_of_a_deleted_version_does_not_match_a_recreated_doc(store: Store) -> None:
    old = store.create(D("p", "a", v=1))
    assert old is not None
    store.delete("p", "a")
    new = store.create(D("p", "a", v=2))
    assert new is not None and new != old
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=3), if_match=old)
    got = store.read("p", "a")
    assert got is not None and got["v"] == 2


def test_upsert_creates_then_replaces(store: Store) -> None:
    first = store.upsert(D("p", "a", v=1))
    got = store.read("p", "a")
    assert got is not None and got["v"] == 1 and got["_etag"] == first
    second = store.upsert(D("p", "a", v=2))
    assert second != first
    got = store.read("p", "a")
    assert got is not None and body(got) == D("p", "a", v=2) and got["_etag"] == second
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=3), if_match=first)


def test_replace_drops_fields_not_in_the_new_body(store: Store) -> None:
    etag = store.create(D("p", "a", keep=1, drop=2))
    store.replace(D("p", "a", keep=1), if_match=etag)
    assert body(store.read("p", "a")) == D("p", "a", keep=1)
    store.upsert(D("p", "a", other=3))
    assert body(store.read("p", "a")) == D("p", "a", other=3)


def test_every_write_gets_a_new_etag(store: Store) -> None:
    etags = [store.create(D("p", "a", v=0))]
    for v in range(1, 4):
        etags.append(store.replace(D("p", "a", v=v), if_match=etags[-1]))
    for v in range(4, 6):
        etags.append(store.upsert(D("p", "a", v=v)))
    etags.append(store.create(D("p", "b")))
    assert all(isinstance(e, str) for e in etags)
    assert len(set(etags)) == len(etags)


def test_delete(store: Store) -> None:
    store.create(D("p", "a"))
    store.create(D("p", "b"))
    assert store.delete("p", "a") is True
    assert store.read("p", "a") is None
    assert store.read("p", "b") is not None
    assert store.delete("p", "a") is False
    assert store.delete("p", "never") is False
    assert store.delete("p", "never", if_match="1") is False


def test_delete_with_etag(store: Store) -> None:
    old = store.create(D("p", "a", v=1))
    current = store.replace(D("p", "a", v=2), if_match=old)
    with pytest.raises(ConflictError):
        store.delete("p", "a", if_match=old)
    got = store.read("p", "a")
    assert got is not None and got["_etag"] == current
    assert store.delete("p", "a", if_match=current) is True
    assert store.read("p", "a") is None


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "a"},
        {"pk": "", "id": "a"},
        {"pk": "p"},
        {"pk": "p", "id": ""},
        {"pk": 1, "id": "a"},
        {"pk": "p", "id": 7},
    ],
)
def test_documents_need_string_pk_and_id(store: Store, bad: Doc) -> None:
    with pytest.raises(ConfigurationError):
        store.create(bad)
    with pytest.raises(ConfigurationError):
        store.upsert(bad)
    with pytest.raises(ConfigurationError):
        store.replace(bad, if_match=None)


def test_same_id_in_two_partitions_is_independent(store: Store) -> None:
    e1 = store.create(D("p1", "x", v=1))
    e2 = store.create(D("p2", "x", v=2))
    assert e1 is not None and e2 is not None and e1 != e2
    assert store.create(D("p2", "x", v=99)) is None
    store.replace(D("p1", "x", v=10), if_match=e1)
    with pytest.raises(ConflictError):  # p1's etag means nothing in p2
        store.replace(D("p2", "x", v=20), if_match=e1)
    assert store.read("p2", "x")["v"] == 2  # type: ignore[index]
    assert store.delete("p2", "x") is True
    assert store.read("p1", "x")["v"] == 10  # type: ignore[index]
    assert store.read("p2", "x") is None
    assert [d["id"] for d in store.query_partition("p1").docs] == ["x"]
    assert store.query_partition("p2").docs == []


# --- first writer wins ------------------------------------------------------------------------

N_RACERS = 20


def test_first_writer_wins_across_threads(store: Store) -> None:
    results = run_threads(N_RACERS, lambda i: store.create(D("race", "winner", who=i)))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1, results
    got = store.read("race", "winner")
    assert got is not None and got["who"] == winners[0] and got["_etag"] == results[winners[0]]


def test_one_of_concurrent_replaces_with_the_same_etag_wins(store: Store) -> None:
    etag = store.create(D("race", "doc", who=None))
    assert etag is not None

    def replace(i: int) -> str | None:
        try:
            return store.replace(D("race", "doc", who=i), if_match=etag)
        except ConflictError:
            return None

    results = run_threads(N_RACERS, replace)
    assert not [r for r in results if isinstance(r, BaseException)], results
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1, results
    got = store.read("race", "doc")
    assert got is not None and got["who"] == winners[0] and got["_etag"] == results[winners[0]]


def test_one_of_concurrent_batches_creating_one_id_wins(store: Store) -> None:
    def batch(i: int) -> bool:
        try:
            store.batch("race", [Op.create(D("race", f"mine-{i}")), Op.create(D("race", "winner", who=i))])
        except ConflictError:
            return False
        return True

    results = run_threads(N_RACERS, batch)
    assert not [r for r in results if isinstance(r, BaseException)], results
    winners = [i for i, r in enumerate(results) if r is True]
    assert len(winners) == 1, results
    ids = set(state(store, "race"))
    assert ids == {"winner", f"mine-{winners[0]}"}  # the losers' other creates were not applied
    assert store.read("race", "winner")["who"] == winners[0]  # type: ignore[index]


def _race_in_process(url: str, barrier: Any, results: Any, i: int, doc_id: str) -> None:
    """Child of the cross-process tests (module level so that spawn can import it)."""
    try:
        store = store_from_url(url)
        store.read("race", "warm-up")  # connect (and, on a fresh store, set it up) first
        barrier.wait(timeout=120)
        results.put((i, store.create(D("race", doc_id.format(i=i), who=i))))
        store.close()
    except BaseException as exc:  # noqa: B036 - reported to the parent
        barrier.abort()  # release the others at once instead of letting them time out
        results.put((i, exc))


def race_processes(url: str, doc_id: str) -> dict[int, Any]:
    """Run ``_race_in_process`` in N_RACERS spawned processes; their answers by index."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(N_RACERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_race_in_process, args=(url, barrier, results, i, doc_id)) for i in range(N_RACERS)]
    for p in procs:
        p.start()
    try:
        return dict(results.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def test_first_writer_wins_across_processes(shared_store_url: str) -> None:
    with closing(store_from_url(shared_store_url)) as setup:
        setup.read("race", "set-up")  # the store exists before the race
    answers = race_processes(shared_store_url, "winner")
    errors = {i: r for i, r in answers.items() if isinstance(r, BaseException)}
    assert not errors, errors
    winners = [i for i, r in answers.items() if r is not None]
    assert len(answers) == N_RACERS and len(winners) == 1, answers
    with closing(store_from_url(shared_store_url)) as after:
        got = after.read("race", "winner")
    assert got is not None and got["who"] == winners[0] and got["_etag"] == answers[winners[0]]


def test_processes_can_start_together_on_a_fresh_store(shared_store_url: str) -> None:
    # several worker processes starting at once on a new file / container
    answers = race_processes(shared_store_url, "mine-{i}")
    errors = {i: r for i, r in answers.items() if isinstance(r, BaseException)}
    assert not errors, errors
    assert all(isinstance(r, str) for r in answers.values()) and len(answers) == N_RACERS
    with closing(store_from_url(shared_store_url)) as after:
        ids = {d["id"] for d in after.query_partition("race").docs}
    assert ids == {f"mine-{i}" for i in range(N_RACERS)}


# --- batches --------------------------------------------------------------------------------


def test_batch_of_mixed_operations(store: Store) -> None:
    ea = store.create(D("p", "a", v=1))
    store.create(D("p", "b", v=1))
    ec = store.create(D("p", "c", v=1))
    store.create(D("p", "f", v=1))
    store.create(D("other", "d", v=1))  # same id elsewhere: create in p must still work
    out = store.batch(
        "p",
        [
            Op.replace(D("p", "a", v=2), if_match=ea),
            Op.upsert(D("p", "b", v=2)),
            Op.delete("c", if_match=ec),
            Op.create(D("p", "d", v=2)),
            Op.upsert(D("p", "e", v=2)),
            Op.replace(D("p", "f", v=2), if_match=None),
        ],
    )
    assert len(out) == 6 and out[2] is None
    assert all(isinstance(e, str) and e for i, e in enumerate(out) if i != 2)
    docs = state(store, "p")
    assert set(docs) == {"a", "b", "d", "e", "f"}
    for doc_id, etag in zip("abdef", [out[0], out[1], out[3], out[4], out[5]], strict=True):
        assert body(docs[doc_id]) == D("p", doc_id, v=2)
        assert docs[doc_id]["_etag"] == etag == store.read("p", doc_id)["_etag"]  # type: ignore[index]
    assert store.read("other", "d")["v"] == 1  # type: ignore[index]
    with pytest.raises(ConflictError):  # a's pre-batch etag is now stale
        store.replace(D("p", "a", v=3), if_match=ea)


def test_batch_of_creates_only(store: Store) -> None:
    out = store.batch("p", [Op.create(D("p", f"s{i}", i=i)) for i in range(6)])
    assert len(out) == 6 and len(set(out)) == 6
    docs = state(store, "p")
    assert {d: body(docs[d]) for d in docs} == {f"s{i}": D("p", f"s{i}", i=i) for i in range(6)}
    assert [docs[f"s{i}"]["_etag"] for i in range(6)] == out


def test_empty_batch(store: Store) -> None:
    assert store.batch("p", []) == []
    assert store.query_partition("p").docs == []


FAILING_OPS: dict[str, Callable[[dict[str, str]], Op]] = {
    "create-existing": lambda etags: Op.create(D("p", "x", v="new")),
    "replace-stale-etag": lambda etags: Op.replace(D("p", "y", v="new"), if_match=etags["y-old"]),
    "replace-missing": lambda etags: Op.replace(D("p", "missing", v="new"), if_match=None),
    "replace-missing-with-etag": lambda etags: Op.replace(D("p", "missing", v="new"), if_match=etags["x"]),
    "delete-missing": lambda etags: Op.delete("missing"),
    "delete-stale-etag": lambda etags: Op.delete("y", if_match=etags["y-old"]),
}


@pytest.mark.parametrize("failing", list(FAILING_OPS))
@pytest.mark.parametrize("position", ["first", "last"])
def test_failing_batch_applies_nothing(store: Store, failing: str, position: str) -> None:
    etags = {"x": store.create(D("p", "x", v="old")), "y-old": store.create(D("p", "y", v="old"))}
    etags["y"] = store.replace(D("p", "y", v="current"), if_match=etags["y-old"])
    etags["z"] = store.create(D("p", "z", v="old"))
    etags["w"] = store.create(D("p", "w", v="old"))
    before = state(store, "p")
    good = [
        Op.create(D("p", "new-1", v="new")),
        Op.upsert(D("p", "new-2", v="new")),
        Op.replace(D("p", "z", v="new"), if_match=etags["z"]),
        Op.upsert(D("p", "x2", v="new")),
        Op.delete("w", if_match=etags["w"]),
    ]
    bad = FAILING_OPS[failing](etags)  # type: ignore[arg-type]
    ops = [bad, *good] if position == "first" else [*good, bad]
    with pytest.raises(ConflictError):
        store.batch("p", ops)
    assert state(store, "p") == before


def test_batch_limit(store: Store) -> None:
    too_many = [Op.create(D("p", f"d{i}")) for i in range(MAX_BATCH_OPS + 1)]
    with pytest.raises(ConfigurationError):
        store.batch("p", too_many)
    assert store.query_partition("p").docs == []
    out = store.batch("p", too_many[:MAX_BATCH_OPS])
    assert len(out) == MAX_BATCH_OPS == len(store.query_partition("p").docs)


def test_batch_ops_must_be_in_the_partition_and_distinct(store: Store) -> None:
    with pytest.raises(ConfigurationError):
        store.batch("p", [Op.create(D("p", "a")), Op.create(D("q", "b"))])
    with pytest.raises(ConfigurationError):
        store.batch("p", [Op.create(D("p", "a")), Op.upsert(D("p", "a", v=2))])
    assert store.query_partition("p").docs == [] and store.query_partition("q").docs == []


# --- awkward ids and partition keys -------------------------------------------------------


@pytest.mark.parametrize("doc_id", AWKWARD_IDS)
def test_awkward_ids_round_trip(store: Store, doc_id: str) -> None:
    pk = "p"
    etag = store.create(D(pk, doc_id, v=1, due_kind="clock", due_at=T0 - 1))
    assert etag is not None
    assert store.create(D(pk, doc_id, v=99)) is None
    got = store.read(pk, doc_id)
    assert got is not None and got["id"] == doc_id and got["v"] == 1 and got["_etag"] == etag
    assert [d["id"] for d in store.query_partition(pk).docs] == [doc_id]
    assert store.scan_due("clock", T0) == [DueRef(pk, doc_id, T0 - 1)]
    etag = store.replace(D(pk, doc_id, v=2), if_match=etag)
    out = store.batch(pk, [Op.replace(D(pk, doc_id, v=3), if_match=etag), Op.create(D(pk, doc_id + "-sibling"))])
    got = store.read(pk, doc_id)
    assert got is not None and got["v"] == 3 and got["_etag"] == out[0]
    assert sorted(d["id"] for d in store.query_partition(pk).docs) == sorted([doc_id, doc_id + "-sibling"])
    store.batch(pk, [Op.delete(doc_id + "-sibling")])
    assert store.read(pk, doc_id + "-sibling") is None
    assert store.delete(pk, doc_id, if_match=out[0]) is True
    assert store.read(pk, doc_id) is None


@pytest.mark.foreign_documents  # a store holds any document: these are not the engine's
@pytest.mark.parametrize("pk", AWKWARD_IDS)
def test_awkward_partition_keys_round_trip(store: Store, pk: str) -> None:
    etag = store.create(D(pk, "exec", v=1, due_kind="lease", due_at=T0 - 1))
    assert store.read(pk, "exec")["_etag"] == etag  # type: ignore[index]
    assert [body(d) for d in store.query_partition(pk).docs] == [D(pk, "exec", v=1, due_kind="lease", due_at=T0 - 1)]
    assert store.scan_due("lease", T0) == [DueRef(pk, "exec", T0 - 1)]
    out = store.batch(pk, [Op.replace(D(pk, "exec", v=2), if_match=etag), Op.create(D(pk, "step"))])
    assert store.read(pk, "exec")["_etag"] == out[0]  # type: ignore[index]
    assert store.query_partition(pk + "x").docs == [] and store.query_partition(pk[:-1]).docs == []
    assert store.scan_due("lease", T0) == []
    assert store.delete(pk, "exec", if_match=out[0]) is True


# --- document size -------------------------------------------------------------------------


def sized(pk: str, doc_id: str, size: int, char: str = "x") -> Doc:
    """A document whose size as sent (compact JSON, non-ASCII escaped: ``doc_size``) is exactly
    ``size`` bytes."""
    doc = D(pk, doc_id, blob="")
    room = size - doc_size(doc)
    per = len(json.dumps(char)) - 2
    doc["blob"] = char * (room // per) + "x" * (room % per)
    assert doc_size(doc) == size
    return doc


def test_document_just_under_the_limit_is_accepted(store: Store) -> None:
    # 1 KiB of headroom: real Cosmos counts its system properties (_rid, _ts, ...) too
    doc = sized("p", "big", MAX_DOC_BYTES - 1024)
    etag = store.create(doc)
    assert etag is not None
    got = store.read("p", "big")
    assert got is not None and got["blob"] == doc["blob"]
    etag = store.replace(sized("p", "big", MAX_DOC_BYTES - 1024, char="é"), if_match=etag)
    assert store.read("p", "big")["_etag"] == etag  # type: ignore[index]


@pytest.mark.parametrize("how", ["create", "replace", "upsert", "batch"])
@pytest.mark.parametrize("char", ["x", "é", "🙂"])
def test_document_over_the_limit_is_rejected(store: Store, how: str, char: str) -> None:
    # past the 2 MB item limit a document is offloaded into chunks (test_contract_large.py), up
    # to the store's max payload: the limit enforced here
    assert isinstance(store, Offloading)
    store.max_payload = MAX_DOC_BYTES
    etag = store.create(D("p", "big", v="small"))
    before = state(store, "p")
    # counted in UTF-8 bytes: with multi-byte chars the string is far shorter than the limit
    doc = sized("p", "big" if how != "create" else "new", MAX_DOC_BYTES + 1, char=char)
    with pytest.raises(DocumentTooLarge) as info:
        if how == "create":
            store.create(doc)
        elif how == "replace":
            store.replace(doc, if_match=etag)
        elif how == "upsert":
            store.upsert(doc)
        else:
            store.batch("p", [Op.create(D("p", "fine")), Op.replace(doc, if_match=etag)])
    assert info.value.limit == MAX_DOC_BYTES and info.value.size > MAX_DOC_BYTES
    assert state(store, "p") == before


# --- query_partition -------------------------------------------------------------------------


def test_query_partition_returns_exactly_the_partition(store: Store) -> None:
    assert store.query_partition("p").docs == []
    mine = {f"d{i}": D("p", f"d{i}", i=i, due_kind="clock" if i % 2 else None, due_at=T0 + i) for i in range(7)}
    for doc in mine.values():
        store.create(doc)
    store.create(D("p-other", "d0", i=-1))
    store.create(D("q", "d1", i=-1))
    store.create(D("pp", "d2", i=-1))
    store.delete("p", "d6")
    del mine["d6"]
    docs = store.query_partition("p").docs
    assert len(docs) == len(mine)
    assert {d["id"]: body(d) for d in docs} == mine
    for d in docs:
        assert d["_etag"] == store.read("p", d["id"])["_etag"]  # type: ignore[index]


def test_query_partition_since_cursor_returns_what_changed(store: Store) -> None:
    for i in range(6):
        store.create(D("p", f"d{i}", v=0))
    first = store.query_partition("p")
    seen = {d["id"]: d for d in first.docs}
    e0 = seen["d0"]["_etag"]
    store.replace(D("p", "d0", v=1), if_match=e0)
    store.upsert(D("p", "d1", v=1))
    store.create(D("p", "d6", v=1))
    store.batch("p", [Op.replace(D("p", "d2", v=1), if_match=seen["d2"]["_etag"]), Op.create(D("p", "d7", v=1))])
    store.create(D("q", "d8", v=1))  # another partition: never in p's answer
    second = store.query_partition("p", since=first.cursor)
    got = {d["id"]: d for d in second.docs}
    changed = {"d0", "d1", "d2", "d6", "d7"}
    assert changed <= set(got)
    assert set(got) <= set(seen) | changed
    for doc_id in changed:
        assert got[doc_id]["v"] == 1 and got[doc_id]["_etag"] == store.read("p", doc_id)["_etag"]  # type: ignore[index]
    for doc_id in set(got) - changed:  # unchanged ones may come again, but as they were
        assert got[doc_id] == seen[doc_id]
    # nothing changed since the second read: whatever comes back is unchanged
    third = store.query_partition("p", since=second.cursor)
    current = state(store, "p")
    for d in third.docs:
        assert d == current[d["id"]]
    # a later change after the third cursor still shows
    store.replace(D("p", "d3", v=2), if_match=current["d3"]["_etag"])
    fourth = {d["id"]: d for d in store.query_partition("p", since=third.cursor).docs}
    assert fourth["d3"]["v"] == 2


def test_query_partition_since_cursor_of_empty_partition(store: Store) -> None:
    empty = store.query_partition("p")
    assert empty.docs == []
    store.create(D("p", "a", v=1))
    got = store.query_partition("p", since=empty.cursor).docs
    assert [body(d) for d in got] == [D("p", "a", v=1)]


# --- read_many: several documents of one partition in one round trip -------------------------------


def test_read_many_answers_in_the_order_asked(store: Store) -> None:
    for doc_id in ("a", "b", "c"):
        store.create(D("p", doc_id, v=doc_id * 2))
    got = store.read_many("p", ["c", "a", "b"])
    assert [body(d) for d in got] == [D("p", "c", v="cc"), D("p", "a", v="aa"), D("p", "b", v="bb")]
    assert [body(d) for d in store.read_many("p", ("b",))] == [D("p", "b", v="bb")]  # any sequence


def test_read_many_gives_none_for_missing_ids(store: Store) -> None:
    store.create(D("p", "a", v=1))
    store.create(D("p", "gone"))
    store.delete("p", "gone")
    got = store.read_many("p", ["nope", "a", "gone", "also-nope"])
    assert [body(d) for d in got] == [None, D("p", "a", v=1), None, None]
    assert store.read_many("empty-partition", ["a", "b"]) == [None, None]


def test_read_many_with_repeated_ids_gives_independent_copies(store: Store) -> None:
    store.create(D("p", "a", items=[1], nested={"k": "v"}))
    store.create(D("p", "b"))
    first, other, again, missing, missing_again = store.read_many("p", ["a", "b", "a", "x", "x"])
    assert first == again and first is not None and again is not None and first is not again
    assert body(other) == D("p", "b") and missing is None and missing_again is None
    first["items"].append(2)
    first["nested"]["k"] = "changed"
    assert body(again) == D("p", "a", items=[1], nested={"k": "v"})  # not the same objects
    assert body(store.read("p", "a")) == D("p", "a", items=[1], nested={"k": "v"})  # nor the stored ones


def test_read_many_of_no_ids(store: Store) -> None:
    store.create(D("p", "a"))
    assert store.read_many("p", []) == []
    assert store.read_many("p", ()) == []


def test_read_many_refuses_a_bare_string(store: Store) -> None:
    store.create(D("p", "a"))
    with pytest.raises(ConfigurationError, match="sequence of ids"):
        store.read_many("p", "a")


def test_read_many_etags_are_reads_etags_and_usable(store: Store) -> None:
    etags = {
        "plain": store.create(D("p", "plain", v=1)),
        "due": store.create(D("p", "due", v=1, due_kind="lease", due_at=T0 + 300)),
    }
    etags["plain"] = store.replace(D("p", "plain", v=2), if_match=etags["plain"])
    (etags["batched"],) = store.batch("p", [Op.create(D("p", "batched", v=1))])
    got = store.read_many("p", list(etags))
    for doc_id, doc in zip(etags, got, strict=True):
        assert doc is not None and doc["id"] == doc_id
        assert doc["_etag"] == etags[doc_id] == store.read("p", doc_id)["_etag"]  # type: ignore[index]
    for doc in got:
        assert doc is not None
        # the etag works as read()'s does: a replace conditioned on it succeeds, then it is stale
        store.replace(dict(doc, v=9), if_match=doc["_etag"])
        with pytest.raises(ConflictError):
            store.replace(dict(doc, v=10), if_match=doc["_etag"])
    assert store.scan_due("lease", T0 + 300) == [DueRef("p", "due", T0 + 300)]  # the due index survived


def test_read_many_never_returns_another_partition(store: Store) -> None:
    store.create(D("p", "a", where="p"))
    for pk in ("q", "pp", "P", "p-other", "p "):
        for doc_id in ("a", "b"):
            store.create(D(pk, doc_id, where=pk))
    got = store.read_many("p", ["b", "a", "b"])
    assert [body(d) for d in got] == [None, D("p", "a", where="p"), None]
    assert [d["where"] for d in store.read_many("q", ["a", "b"]) if d is not None] == ["q", "q"]


def test_read_many_of_awkward_ids_and_partition_keys(store: Store) -> None:
    for pk in ("p", AWKWARD_IDS[0], AWKWARD_IDS[5]):
        for n, doc_id in enumerate(AWKWARD_IDS):
            store.create(D(pk, doc_id, n=n, due_kind="clock" if n % 2 else None, due_at=T0 + n))
        wanted = [*reversed(AWKWARD_IDS), "missing/one#?", AWKWARD_IDS[3]]
        got = store.read_many(pk, wanted)
        assert [d and d["id"] for d in got] == [*reversed(AWKWARD_IDS), None, AWKWARD_IDS[3]]
        assert [d and d["n"] for d in got] == [*reversed(range(len(AWKWARD_IDS))), None, 3]
        assert all(d is None or (d["pk"] == pk and d["_etag"] == store.read(pk, d["id"])["_etag"]) for d in got)  # type: ignore[index]


def test_read_many_of_many_ids(store: Store) -> None:
    """More ids than one statement of some backends takes (SQLite: 500 a statement)."""
    n = 650
    for start in range(0, n, MAX_BATCH_OPS):
        store.batch("p", [Op.create(D("p", f"d{i:04}", i=i)) for i in range(start, min(n, start + MAX_BATCH_OPS))])
    wanted = [f"d{i:04}" for i in range(2 * n - 1, -1, -1)]  # half of them missing, newest first
    got = store.read_many("p", wanted)
    assert [d and d["i"] for d in got] == [None] * n + list(range(n - 1, -1, -1))


def test_read_many_costs_one_round_trip(request: pytest.FixtureRequest, backend: str, store: Store) -> None:
    for doc_id in ("a", "b", "c"):
        store.create(D("p", doc_id))
    ids = ["c", "missing", "a", "b", "a"]
    if backend == "memory":
        before = dict(store.calls)  # type: ignore[attr-defined]
        got = store.read_many("p", ids)
        after = dict(store.calls)  # type: ignore[attr-defined]
        assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == {"read_many": 1}
    elif backend == "sqlite":
        statements: list[str] = []
        store.reopen()  # drop pooled connections: the next one is traced
        connect = store._connect  # type: ignore[attr-defined]

        def traced_connect() -> sqlite3.Connection:
            conn: sqlite3.Connection = connect()
            conn.set_trace_callback(statements.append)
            return conn

        store._connect = traced_connect  # type: ignore[attr-defined]
        got = store.read_many("p", ids)
        assert len(statements) == 1 and "IN (" in statements[0], statements
    elif backend == "postgres":
        from tests.plugins.postgres import round_trips

        got, trips = round_trips(store, lambda: store.read_many("p", ids), request.getfixturevalue("tmp_path"))
        assert trips == 1, trips
    else:
        server = request.getfixturevalue("cosmos_server")
        server.reset_stats()
        got = store.read_many("p", ids)
        stats = server.stats()
        # "other" is the SDK's own metadata traffic (account/container reads it refreshes on
        # its own schedule), not a round trip of read_many
        doc_ops = {op: n for op, n in stats["ops"].items() if op != "other"}
        assert doc_ops == {"query": 1}, stats
    assert [d and d["id"] for d in got] == ["c", None, "a", "b", "a"]


# --- scan_due ------------------------------------------------------------------------------


def seed_due(store: Store) -> None:
    store.create(D("e1", "clock:1", due_kind="clock", due_at=T0 - 30))
    store.create(D("e2", "clock:1", due_kind="clock", due_at=T0 - 10))
    store.create(D("e1", "clock:2", due_kind="clock", due_at=T0 - 20))
    store.create(D("e3", "clock:1", due_kind="clock", due_at=T0))  # due exactly now: included
    store.create(D("e3", "clock:future", due_kind="clock", due_at=T0 + 100))
    store.create(D("e1", "exec", due_kind="lease", due_at=T0 - 25))  # other kind
    store.create(D("e2", "exec", status="completed"))  # no due fields
    store.create(D("e4", "half", due_kind="clock"))  # kind without time: not due
    store.create(D("e4", "half2", due_at=T0 - 50))  # time without kind: not due
    store.create(D("e4", "nulls", due_kind=None, due_at=None))


def test_scan_due_returns_exactly_the_due_oldest_first(store: Store) -> None:
    seed_due(store)
    assert store.scan_due("clock", T0) == [
        DueRef("e1", "clock:1", T0 - 30),
        DueRef("e1", "clock:2", T0 - 20),
        DueRef("e2", "clock:1", T0 - 10),
        DueRef("e3", "clock:1", T0),
    ]
    assert store.scan_due("lease", T0) == [DueRef("e1", "exec", T0 - 25)]
    assert store.scan_due("outbox", T0) == []
    assert store.scan_due("clock", T0 - 31) == []
    assert [r.id for r in store.scan_due("clock", T0 + 100)][-1] == "clock:future"


def test_scan_due_respects_limit(store: Store) -> None:
    seed_due(store)
    assert store.scan_due("clock", T0, limit=2) == [DueRef("e1", "clock:1", T0 - 30), DueRef("e1", "clock:2", T0 - 20)]
    assert store.scan_due("clock", T0, limit=1) == [DueRef("e1", "clock:1", T0 - 30)]
    many = [Op.create(D("m", f"c{i:03d}", due_kind="tick", due_at=T0 - 1000 + i)) for i in range(MAX_BATCH_OPS)]
    store.batch("m", many)
    got = store.scan_due("tick", T0, limit=37)
    assert [r.id for r in got] == [f"c{i:03d}" for i in range(37)]
    assert len(store.scan_due("tick", T0)) == 100  # the default limit
    assert len(store.scan_due("tick", T0, limit=1000)) == MAX_BATCH_OPS


def test_doc_leaves_the_scan_when_its_due_fields_go(store: Store) -> None:
    seed_due(store)
    c11 = store.read("e1", "clock:1")
    assert c11 is not None
    store.replace(D("e1", "clock:1", fired=True), if_match=c11["_etag"])  # keys removed
    store.upsert(D("e1", "clock:2", due_kind=None, due_at=None))  # keys set to None
    c21 = store.read("e2", "clock:1")
    assert c21 is not None
    store.batch("e2", [Op.replace(D("e2", "clock:1", due_kind="clock"), if_match=c21["_etag"])])  # time gone
    store.delete("e3", "clock:1")
    assert store.scan_due("clock", T0) == []
    assert [r.id for r in store.scan_due("clock", T0 + 100)] == ["clock:future"]


def test_due_time_moved_later_or_earlier(store: Store) -> None:
    seed_due(store)
    c11 = store.read("e1", "clock:1")
    assert c11 is not None
    store.replace(D("e1", "clock:1", due_kind="clock", due_at=T0 + 50), if_match=c11["_etag"])
    future = store.read("e3", "clock:future")
    assert future is not None
    store.replace(D("e3", "clock:future", due_kind="clock", due_at=T0 - 40), if_match=future["_etag"])
    assert store.scan_due("clock", T0) == [
        DueRef("e3", "clock:future", T0 - 40),
        DueRef("e1", "clock:2", T0 - 20),
        DueRef("e2", "clock:1", T0 - 10),
        DueRef("e3", "clock:1", T0),
    ]
    assert DueRef("e1", "clock:1", T0 + 50) not in store.scan_due("clock", T0 + 49)
    assert store.scan_due("clock", T0 + 50)[-1] == DueRef("e1", "clock:1", T0 + 50)
    # moving to another kind moves it between scans
    store.upsert(D("e2", "clock:1", due_kind="lease", due_at=T0 - 10))
    assert DueRef("e2", "clock:1", T0 - 10) not in store.scan_due("clock", T0)
    assert DueRef("e2", "clock:1", T0 - 10) in store.scan_due("lease", T0)


def test_scan_due_sees_batched_due_fields(store: Store) -> None:
    store.batch("e9", [Op.create(D("e9", "exec", due_kind="lease", due_at=T0 - 5)), Op.create(D("e9", "s1"))])
    assert store.scan_due("lease", T0) == [DueRef("e9", "exec", T0 - 5)]
    etag = store.read("e9", "exec")["_etag"]  # type: ignore[index]
    store.batch("e9", [Op.replace(D("e9", "exec", status="completed"), if_match=etag), Op.delete("s1")])
    assert store.scan_due("lease", T0) == []


# --- listing, reopening, handles ------------------------------------------------------------------


def test_scan_partitions(store: Store) -> None:
    for pk in ["wf-2", "wf-1", "wf-10", "other-1", "wf"]:
        store.create(D(pk, "exec"))
        store.create(D(pk, "act:1"))
    store.create(D("wf-3", "act:1"))  # no exec document
    assert store.scan_partitions("wf-") == ["wf-1", "wf-10", "wf-2"]
    assert store.scan_partitions("wf") == ["wf", "wf-1", "wf-10", "wf-2"]
    assert store.scan_partitions("wf-", limit=2) == ["wf-1", "wf-10"]
    assert store.scan_partitions("") == ["other-1", "wf", "wf-1", "wf-10", "wf-2"]
    assert store.scan_partitions("zzz") == []


def test_reopen_keeps_the_data_and_keeps_working(store: Store) -> None:
    etag = store.create(D("p", "a", v=1))
    store.reopen()
    got = store.read("p", "a")
    assert got is not None and got["_etag"] == etag
    assert store.replace(D("p", "a", v=2), if_match=etag) != etag
    store.reopen()
    assert store.read("p", "a")["v"] == 2  # type: ignore[index]


def test_another_handle_sees_the_same_data(other_handle: Callable[[], Store], store: Store) -> None:
    etag = store.create(D("p", "a", v=1))
    other = other_handle()
    assert other.read("p", "a")["_etag"] == etag  # type: ignore[index]
    assert other.create(D("p", "a", v=2)) is None
    new = other.replace(D("p", "a", v=3), if_match=etag)
    with pytest.raises(ConflictError):
        store.replace(D("p", "a", v=4), if_match=etag)
    assert store.read("p", "a")["_etag"] == new  # type: ignore[index]
    cursor = store.query_partition("p").cursor
    other.create(D("p", "b"))
    assert "b" in {d["id"] for d in store.query_partition("p", since=cursor).docs}


@contextmanager
def outage(request: pytest.FixtureRequest, url: str) -> Iterator[None]:
    """Make the store behind ``url`` unavailable for writes while the block runs."""
    if url.startswith("sqlite:"):
        holder = sqlite3.connect(url.split(":///", 1)[1].split("?", 1)[0], isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock for too long
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    elif url.startswith("postgres"):
        proxy = request.getfixturevalue("postgres_proxy")  # shared_store_url goes through it
        proxy.pause()  # the server is gone: connections refused, open ones cut
        try:
            yield
        finally:
            proxy.resume()
    else:
        server = request.getfixturevalue("cosmos_server")
        server.pause()  # the listener goes away and open connections are cut
        try:
            yield
        finally:
            server.resume()


def test_outage_raises_store_unavailable_then_recovers(request: pytest.FixtureRequest, shared_store_url: str) -> None:
    url = shared_store_url + ("?busy_timeout=0.2" if shared_store_url.startswith("sqlite:") else "")
    store = store_from_url(url)
    etag = store.create(D("p", "a", v=1))
    with outage(request, url):
        with pytest.raises(StoreUnavailable):
            store.create(D("p", "b"))
        with pytest.raises(StoreUnavailable):
            store.replace(D("p", "a", v=2), if_match=etag)
        with pytest.raises(StoreUnavailable):
            store.batch("p", [Op.create(D("p", "c"))])
    assert store.read("p", "b") is None and store.read("p", "c") is None
    assert store.read("p", "a")["v"] == 1  # type: ignore[index]
    assert store.create(D("p", "b")) is not None
    assert store.replace(D("p", "a", v=2), if_match=etag) != etag


# --- SQLite specifics ----------------------------------------------------------------------------


def sqlite_url(path: Path, **query: Any) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"sqlite:///{path}" + (f"?{q}" if q else "")


def test_sqlite_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_durable.stores.sqlite.store import SqliteStore

    monkeypatch.chdir(tmp_path)
    rel = store_from_url("sqlite:///rel.db")
    assert isinstance(rel, SqliteStore) and rel.path == "rel.db"
    rel.create(D("p", "a"))
    assert (tmp_path / "rel.db").exists()
    absolute = store_from_url(f"sqlite:///{tmp_path}/abs.db?busy_timeout=0.5")
    assert isinstance(absolute, SqliteStore)
    assert absolute.path == f"{tmp_path}/abs.db" and absolute.busy_timeout == 0.5
    absolute.create(D("p", "a"))
    assert (tmp_path / "abs.db").exists()
    assert store_from_url(sqlite_url(tmp_path / "o.db"), busy_timeout=2).busy_timeout == 2.0  # type: ignore[attr-defined]
    for bad in [
        "sqlite://",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite://host/x.db",
        sqlite_url(tmp_path / "x", nope=1),
    ]:
        with pytest.raises(ConfigurationError):
            store_from_url(bad)


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    store = store_from_url(sqlite_url(tmp_path / "s.db"))
    store.create(D("p", "a"))
    with sqlite3.connect(tmp_path / "s.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_missing_directory_is_unavailable(tmp_path: Path) -> None:
    store = store_from_url(sqlite_url(tmp_path / "no" / "such" / "dir" / "s.db"))
    with pytest.raises(StoreUnavailable) as info:
        store.read("p", "a")
    assert isinstance(info.value.__cause__, sqlite3.Error)
    with pytest.raises(StoreUnavailable):
        store.create(D("p", "a"))


def test_sqlite_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database file at all" * 200)
    with pytest.raises(StoreUnavailable):
        store_from_url(sqlite_url(path)).read("p", "a")


def test_sqlite_locked_beyond_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = store_from_url(sqlite_url(path, busy_timeout=0.2))
    etag = store.create(D("p", "a", v=1))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE meta SET seq = seq")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.create(D("p", "b"))
        assert time.monotonic() - started >= 0.15  # it waited for the busy timeout first
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(StoreUnavailable):
            store.replace(D("p", "a", v=2), if_match=etag)
        with pytest.raises(StoreUnavailable):
            store.batch("p", [Op.create(D("p", "c"))])
        assert store.read("p", "a")["v"] == 1  # type: ignore[index]  # WAL: readers are not blocked
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # the lock is gone: the same store works again (its connections were not poisoned)
    assert store.create(D("p", "b")) is not None
    assert store.replace(D("p", "a", v=2), if_match=etag)


def test_sqlite_corrupt_body_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = store_from_url(sqlite_url(path))
    store.create(D("p", "a"))
    store.create(D("p", "b"))
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE docs SET body = '{not json' WHERE id = 'a'")
        raw.execute("UPDATE docs SET body = '[1, 2]' WHERE id = 'b'")
    for doc_id in ("a", "b"):
        with pytest.raises(CorruptDocument):
            store.read("p", doc_id)
    with pytest.raises(CorruptDocument):
        store.query_partition("p")


def test_sqlite_read_many_reports_a_corrupt_body_like_read(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = store_from_url(sqlite_url(path))
    for doc_id in ("a", "b", "ok"):
        store.create(D("p", doc_id))
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE docs SET body = '{not json' WHERE id = 'a'")
        raw.execute("UPDATE docs SET body = '[1, 2]' WHERE id = 'b'")
    for doc_id in ("a", "b"):
        with pytest.raises(CorruptDocument) as by_read:
            store.read("p", doc_id)
        with pytest.raises(CorruptDocument) as by_many:
            store.read_many("p", ["ok", doc_id, "missing"])
        assert str(by_many.value) == str(by_read.value)
    assert [d and d["id"] for d in store.read_many("p", ["ok", "missing"])] == ["ok", None]


def test_sqlite_read_many_of_an_unreachable_file_is_unavailable(tmp_path: Path) -> None:
    store = store_from_url(sqlite_url(tmp_path / "no" / "such" / "dir" / "s.db"))
    with pytest.raises(StoreUnavailable) as info:
        store.read_many("p", ["a", "b"])
    assert isinstance(info.value.__cause__, sqlite3.Error)


def test_sqlite_data_and_etags_survive_a_new_store_object(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    first = store_from_url(url)
    old = first.create(D("p", "a", v=1, due_kind="clock", due_at=T0 - 1))
    cursor = first.query_partition("p").cursor
    first.close()
    second = store_from_url(url)
    assert second.read("p", "a")["_etag"] == old  # type: ignore[index]
    assert second.scan_due("clock", T0) == [DueRef("p", "a", T0 - 1)]
    new = second.create(D("p", "b"))
    assert new not in (None, old)
    assert [d["id"] for d in second.query_partition("p", since=cursor).docs] == ["b"]


def _fork_child_writes(store: Store, results: Any) -> None:
    try:
        results.put(store.create(D("p", "from-child")))
    except BaseException as exc:  # noqa: B036 - reported to the parent
        results.put(exc)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_sqlite_store_keeps_working_after_fork_without_reopen(tmp_path: Path) -> None:
    store = store_from_url(sqlite_url(tmp_path / "s.db"))
    store.create(D("p", "from-parent"))  # the parent holds an open connection now
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_fork_child_writes, args=(store, results))
    child.start()
    answer = results.get(timeout=60)
    child.join(timeout=60)
    assert isinstance(answer, str), answer
    assert child.exitcode == 0
    assert store.read("p", "from-child")["_etag"] == answer  # type: ignore[index]
    assert store.create(D("p", "after-fork")) is not None


def test_reserved_and_malformed_fields_are_refused_alike(store) -> None:  # type: ignore[no-untyped-def]
    from celery_durable.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="reserved"):
        store.create({"pk": "p", "id": "x", "_private": 1})
    with pytest.raises(ConfigurationError, match="due_at"):
        store.create({"pk": "p", "id": "y", "due_kind": "clock", "due_at": "soon"})
    assert store.read("p", "x") is None and store.read("p", "y") is None


@pytest.mark.foreign_documents
def test_a_lone_surrogate_in_a_document_reads_back_equal_or_is_refused_clearly(store: Store) -> None:
    """``"\\ud800"`` is a JSON string (``json.loads`` gives it) that UTF-8 cannot hold. Documents
    the engine writes itself (error messages, tracebacks, search attributes) can carry one: every
    backend keeps it, escaped, so it reads back equal (SQLite raised a bare UnicodeEncodeError).
    Where an escape would read back as something else (an id; a high surrogate followed by a low
    one, which JSON joins into one character) the write is refused with ConfigurationError."""
    doc = D("p", "exec", err="x\ud800y", nested={"k\udfff": ["\udc80", "\ud83d", "a\\ud800"]}, created_at=T0)
    etag = store.create(doc)
    assert body(store.read("p", "exec")) == doc
    assert [body(d) for d in store.list_execs().docs] == [doc]
    doc["err"] = "\udbff"
    etag = store.replace(doc, if_match=etag)
    store.upsert(D("p", "b", v="\udc00z"))
    out = store.batch("p", [Op.replace(D("p", "exec", v="\ud800"), if_match=etag), Op.create(D("p", "c", v="-\udfff"))])
    assert [body(d) for d in store.read_many("p", ["exec", "b", "c"])] == [
        D("p", "exec", v="\ud800"),
        D("p", "b", v="\udc00z"),
        D("p", "c", v="-\udfff"),
    ]
    before = state(store, "p")
    assert before["exec"]["_etag"] == out[0]
    for bad in (
        lambda: store.create(D("p", "\ud800")),
        lambda: store.create(D("p\udc80", "a")),
        lambda: store.create(D("p", "d", v="\ud800\udc00")),  # would read back as "\U00010000"
        lambda: store.upsert(D("p", "b", v={"\udbff\udfff": 1})),
        lambda: store.batch("p", [Op.create(D("p", "e")), Op.upsert(D("p", "c", v="\ud800\udc00"))]),
    ):
        with pytest.raises(ConfigurationError, match="surrogate"):
            bad()
    assert state(store, "p") == before


# --- list_execs: the operator's paged listing of exec documents ----------------------------------


def _execs(store: Store) -> None:
    """Seven executions (created in ties of two), each with a step document that is never listed."""
    for i in range(7):
        store.create(
            D(
                f"e{i}",
                "exec",
                workflow="even" if i % 2 == 0 else "odd",
                status="running" if i < 4 else "completed",
                created_at=T0 + i // 2,
            )  # fmt: skip
        )
        store.create(D(f"e{i}", "s:000001", created_at=T0 + 100))
    store.create(D("not-an-exec", "exec-like", created_at=T0 + 100))


def _all_pages(store: Store, flt: ExecFilter | None = None, limit: int = 3) -> list[list[str]]:
    pages, cursor = [], None
    for _ in range(50):
        page = store.list_execs(flt, limit=limit, cursor=cursor)
        assert len(page.docs) <= limit
        assert all(d["id"] == "exec" and "_etag" in d for d in page.docs)
        pages.append([d["pk"] for d in page.docs])
        cursor = page.cursor
        if cursor is None:
            return pages
        assert isinstance(cursor, str)
    raise AssertionError("the listing never ended")


def test_list_execs_pages_newest_first_each_exactly_once(store: Store) -> None:
    _execs(store)
    pages = _all_pages(store)
    listed = [pk for page in pages for pk in page]
    assert sorted(listed) == [f"e{i}" for i in range(7)]  # each once, no step document
    created = [int(pk[1:]) // 2 for pk in listed]
    assert created == sorted(created, reverse=True)  # newest first
    assert len(pages) >= 3  # bounded pages, not one answer


def test_list_execs_filters(store: Store) -> None:
    _execs(store)

    def ids(**f: Any) -> set[str]:
        return {pk for page in _all_pages(store, ExecFilter(**f), limit=2) for pk in page}

    assert ids(workflow="odd") == {"e1", "e3", "e5"}
    assert ids(status="completed") == {"e4", "e5", "e6"}
    assert ids(workflow="even", status="running") == {"e0", "e2"}
    assert ids(created_after=T0 + 2) == {"e4", "e5", "e6"}  # inclusive
    assert ids(created_before=T0 + 1) == {"e0", "e1"}  # exclusive
    assert ids(created_after=T0 + 1, created_before=T0 + 3, workflow="odd") == {"e3", "e5"}
    assert ids(workflow="nope") == set()


def test_list_execs_of_an_empty_store(store: Store) -> None:
    page = store.list_execs()
    assert page.docs == [] and page.cursor is None


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE_SIZE + 1])
def test_list_execs_refuses_a_page_size_out_of_bounds(store: Store, limit: int) -> None:
    with pytest.raises(ConfigurationError, match="page size"):
        store.list_execs(limit=limit)


def test_list_execs_sees_writes_and_deletes(store: Store) -> None:
    store.create(D("a", "exec", status="running", created_at=T0))
    etag = store.create(D("b", "exec", status="running", created_at=T0 + 1))
    store.replace(D("b", "exec", status="failed", created_at=T0 + 1), if_match=etag)
    store.delete("a", "exec")
    (doc,) = store.list_execs().docs
    assert body(doc) == D("b", "exec", status="failed", created_at=T0 + 1)


def test_sqlite_list_execs_flags_a_corrupt_exec_and_lists_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = store_from_url(sqlite_url(path))
    for i in range(3):
        store.create(D(f"e{i}", "exec", status="running", created_at=T0 + i))
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE docs SET body = '{not json' WHERE pk = 'e1'")
    docs = store.list_execs().docs
    assert [d["pk"] for d in docs] == ["e2", "e0", "e1"]  # an undecodable one sorts as created at 0
    assert "_corrupt" in docs[2] and "not valid JSON" in docs[2]["_corrupt"]
    assert [d["pk"] for d in store.list_execs(ExecFilter(status="running")).docs] == ["e2", "e0"]


def test_sqlite_list_execs_uses_its_index_and_upgrades_an_old_file(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store_from_url(sqlite_url(path)).create(D("e", "exec", created_at=T0))
    with sqlite3.connect(path) as raw:  # a file written by schema version 1
        raw.execute("DROP INDEX docs_execs")
        raw.execute("PRAGMA user_version = 1")
    store = store_from_url(sqlite_url(path))
    assert [d["pk"] for d in store.list_execs().docs] == ["e"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 4  # 3: search_idx (issue 13 item 5); 4: docs_changes
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'docs_execs'").fetchone() is not None
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'search_idx'").fetchone() is not None
