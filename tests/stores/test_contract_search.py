"""The store contract for search attributes: ``list_execs(ExecFilter(search=...))`` on every backend
(the ``store`` fixture of tests/stores/conftest.py), and its cost: what the first attribute's value
holds, never what the store holds."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest

from celery_durable.errors import InvalidSearchAttribute
from celery_durable.stores import Doc, Op, Store
from celery_durable.stores.base import ExecFilter
from celery_durable.stores.search import check_filter, check_memo, check_search, search_matches

T0 = float(int(time.time()))


def X(pk: str, created: float, search: dict[str, Any] | None = None, **fields: Any) -> Doc:
    doc: Doc = {"pk": pk, "id": "exec", "workflow": "w", "status": "running", "created_at": created, **fields}
    if search is not None:
        doc["search"] = search
    return doc


def _ids(store: Store, limit: int = 2, **flt: Any) -> list[str]:
    """Every page of the listing, flattened (newest first)."""
    out: list[str] = []
    cursor = None
    for _ in range(50):
        page = store.list_execs(ExecFilter(**flt), limit=limit, cursor=cursor)
        assert len(page.docs) <= limit
        out += [d["pk"] for d in page.docs]
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the listing never ended")


def _seed(store: Store) -> None:
    store.create(X("a", T0 + 1, {"customer": "c-42", "priority": 3, "vip": True, "tags": ["red", "big"]}))
    store.create(X("b", T0 + 2, {"customer": "c-42", "priority": 1.0, "vip": False}, workflow="v"))
    store.create(X("c", T0 + 3, {"customer": "c-7", "priority": 3.0, "tags": ["red"]}, status="completed"))
    store.create(X("d", T0 + 4))  # no attributes
    store.create({"pk": "a", "id": "s:000001", "search": {"customer": "c-42"}, "created_at": T0 + 9})  # not an exec


def test_search_equality_and_and(store: Store) -> None:
    _seed(store)
    assert _ids(store, search={"customer": "c-42"}) == ["b", "a"]
    assert _ids(store, search={"priority": 3}) == ["c", "a"]  # 3 == 3.0: numbers compare as numbers
    assert _ids(store, search={"priority": 1}) == ["b"]
    assert _ids(store, search={"vip": True}) == ["a"]  # a bool is not a number
    assert _ids(store, search={"priority": True}) == []
    assert _ids(store, search={"customer": "c-42", "priority": 3}) == ["a"]
    assert _ids(store, search={"customer": "nobody"}) == []
    assert _ids(store, search={"missing": "x"}) == []


def test_search_keyword_lists_match_when_they_hold_the_value(store: Store) -> None:
    _seed(store)
    assert _ids(store, search={"tags": "red"}) == ["c", "a"]
    assert _ids(store, search={"tags": "big", "customer": "c-42"}) == ["a"]
    assert _ids(store, search={"tags": "blue"}) == []


def test_search_with_the_other_filters(store: Store) -> None:
    _seed(store)
    assert _ids(store, search={"tags": "red"}, status="completed") == ["c"]
    assert _ids(store, search={"customer": "c-42"}, workflow="v") == ["b"]
    assert _ids(store, search={"customer": "c-42"}, created_after=T0 + 2) == ["b"]
    assert _ids(store, search={"customer": "c-42"}, created_before=T0 + 2) == ["a"]


def test_search_follows_replace_upsert_batch_and_delete(store: Store) -> None:
    _seed(store)
    a = store.read("a", "exec")
    assert a is not None
    a["search"] = {"customer": "c-9"}
    store.replace(a, a["_etag"])
    assert _ids(store, search={"customer": "c-42"}) == ["b"]
    assert _ids(store, search={"customer": "c-9"}) == ["a"]
    store.upsert(X("b", T0 + 2, {"customer": "c-9"}))
    assert _ids(store, search={"customer": "c-9"}) == ["b", "a"]
    b = store.read("b", "exec")
    assert b is not None
    store.batch("b", [Op.replace({**b, "search": {"customer": "c-1"}}, b["_etag"])])
    assert _ids(store, search={"customer": "c-9"}) == ["a"]
    assert _ids(store, search={"customer": "c-1"}) == ["b"]
    store.delete("a", "exec")
    assert _ids(store, search={"customer": "c-9"}) == []
    c = store.read("c", "exec")
    assert c is not None
    store.batch("c", [Op.delete("exec")])
    assert _ids(store, search={"tags": "red"}) == []
    store.batch("e", [Op.create(X("e", T0 + 5, {"tags": ["red"]}))])
    assert _ids(store, search={"tags": "red"}) == ["e"]


def test_a_big_exec_keeps_its_attributes_indexed(store: Store) -> None:
    """An exec offloaded into chunks (a 3 MB payload) keeps ``search`` on its main document."""
    etag = store.create(X("big", T0, {"customer": "c-42"}, payload={"blob": "x" * (3 * 1024 * 1024)}))
    assert etag is not None
    assert _ids(store, search={"customer": "c-42"}) == ["big"]
    doc = store.read("big", "exec")
    assert doc is not None
    store.replace({**doc, "search": {"customer": "c-43"}}, doc["_etag"])
    assert _ids(store, search={"customer": "c-42"}) == [] and _ids(store, search={"customer": "c-43"}) == ["big"]


def test_search_pages_each_match_once(store: Store) -> None:
    for i in range(9):
        store.create(X(f"m{i}", T0 + i // 2, {"k": "v" if i % 3 else "other"}))
    for limit in (2, 1000):
        listed = _ids(store, limit=limit, search={"k": "v"})
        assert sorted(listed) == sorted(f"m{i}" for i in range(9) if i % 3)  # each once
        created = [int(pk[1:]) // 2 for pk in listed]
        assert created == sorted(created, reverse=True)  # newest first (ties in any order)


def test_search_cost_grows_with_matches_not_with_the_store(store: Store, backend: str) -> None:
    """Executions without the value cost nothing to a search listing: SQLite counts its virtual
    machine steps, Cosmos its point reads; PostgreSQL asks the planner (an index, not the table)."""
    for i in range(3):
        store.create(X(f"hit{i}", T0 + i, {"customer": "rare"}))

    def cost() -> int:
        if backend == "sqlite":
            steps = [0]
            conn = sqlite3.connect(store.path)  # type: ignore[attr-defined]

            def tick() -> int:
                steps[0] += 1
                return 0

            conn.set_progress_handler(tick, 10)
            conn.execute(
                "SELECT s.pk FROM search_idx s CROSS JOIN docs d ON d.pk = s.pk AND d.id = 'exec'"
                " WHERE s.attr = ? AND s.kind = ? AND s.value = ? ORDER BY s.created DESC, s.pk DESC LIMIT 100",
                ("customer", "s", "rare"),
            ).fetchall()
            conn.close()
            return steps[0]
        if backend == "cosmos":
            reads = [0]
            inner = store._read_raw  # type: ignore[attr-defined]

            def counted(pk: str, doc_id: str) -> Any:
                reads[0] += 1
                return inner(pk, doc_id)

            store._read_raw = counted  # type: ignore[attr-defined]
            try:
                assert len(store.list_execs(ExecFilter(search={"customer": "rare"})).docs) == 3
            finally:
                del store._read_raw  # type: ignore[attr-defined]
            return reads[0]
        if backend == "postgres":
            with store._conn() as conn:  # type: ignore[attr-defined]
                conn.execute(f"ANALYZE {store._t}")  # type: ignore[attr-defined]
                # a table of a few pages is cheapest read whole: what is checked is that an index
                # answers at a cost that does not grow with the table, as it would on a large one
                conn.execute("SET enable_seqscan = off")
                sql, params = store._list_sql(ExecFilter(search={"customer": "rare"}), 100, None)  # type: ignore[attr-defined]
                row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
                conn.execute("RESET enable_seqscan")
            plan = row[0][0]["Plan"]
            return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
        assert len(store.list_execs(ExecFilter(search={"customer": "rare"})).docs) == 3
        return 0  # memory: a test double, scans everything by design

    small = cost()
    for i in range(300):
        store.create(X(f"other{i}", T0 + i, {"customer": f"c-{i}"}))
    large = cost()
    assert len(store.list_execs(ExecFilter(search={"customer": "rare"})).docs) == 3
    if backend == "cosmos":
        assert small == large == 3
    else:
        assert large <= small * 1.5 + 5, (small, large)


# --- the rules (stores/search.py) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [
        {"bad-key": 1},
        {"1x": 1},
        {"k" * 65: 1},
        {"k": "x" * 257},
        {"k": 2**53},
        {"k": float("nan")},
        {"k": {"a": 1}},
        {"k": [1, 2]},
        {"k": ["a"] * 40},
        {"k": None},
        {f"k{i}": 1 for i in range(40)},
        {f"k{i}": [c * 256 for c in "abcdefghij"] for i in range(10)},  # over 16 KB in all
        {"k": "nul\x00"},  # PostgreSQL's JSONB cannot hold it
    ],
)
def test_bad_attributes_are_refused(attrs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSearchAttribute):
        check_search(attrs)


def test_attribute_rules() -> None:
    assert check_search({"k": ("a", "b", "a"), "n": 3, "f": 1.5, "b": False}) == {
        "k": ["a", "b"],
        "n": 3,
        "f": 1.5,
        "b": False,
    }
    assert check_search({"k": None}, allow_none=True) == {"k": None}
    with pytest.raises(InvalidSearchAttribute):
        check_filter({"k": ["a"]})
    with pytest.raises(InvalidSearchAttribute):
        check_memo({"x": object()})
    with pytest.raises(InvalidSearchAttribute):
        check_memo("x" * 40000)
    assert search_matches({"n": 3}, {"n": 3.0}) and not search_matches({"n": 1}, {"n": True})


@pytest.mark.cosmos
def test_cosmos_rewrites_entries_only_when_it_cannot_trust_the_version_replaced(cosmos_url: str) -> None:
    """A replace of the version this process wrote, with the same attributes, writes no entries (a
    drive's commit after its lease write); a change, an unconditional write, or another process's
    version writes them. Listing stays right throughout, and a stale entry is dropped once old."""
    from celery_durable.stores import store_from_url
    from celery_durable.stores.cosmos import search as _cosmos_search

    store, other = store_from_url(cosmos_url), store_from_url(cosmos_url)
    upserts: list[str] = []
    inner = store._upsert_internal  # type: ignore[attr-defined]

    def counted(doc: Doc) -> None:
        upserts.append(str(doc["pk"]))
        inner(doc)

    store._upsert_internal = counted  # type: ignore[attr-defined]
    try:
        etag = store.create(X("a", T0, {"customer": "c-42", "tags": ["x", "y"]}))
        assert etag is not None and len(upserts) == 3  # one entry per value
        etag = store.replace(X("a", T0, {"customer": "c-42", "tags": ["x", "y"]}, status="x"), etag)
        assert len(upserts) == 3  # trusted: nothing rewritten
        etag = store.replace(X("a", T0, {"customer": "c-43", "tags": ["x", "y"]}), etag)
        assert len(upserts) == 6
        doc = other.read("a", "exec")
        assert doc is not None
        other.replace({**doc, "status": "completed"}, doc["_etag"])  # another process's version
        fresh = store.read("a", "exec")
        assert fresh is not None
        store.replace({**fresh, "status": "failed"}, fresh["_etag"])
        assert len(upserts) == 9  # not this process's version: rewritten
    finally:
        del store._upsert_internal  # type: ignore[attr-defined]
    assert [d["pk"] for d in store.list_execs(ExecFilter(search={"customer": "c-43"})).docs] == ["a"]
    assert store.list_execs(ExecFilter(search={"customer": "c-42"})).docs == []  # stale entry, verified
    old = _cosmos_search.STALE_AFTER
    _cosmos_search.STALE_AFTER = 0.0
    try:
        store.list_execs(ExecFilter(search={"customer": "c-42"}))  # old enough now: deleted
    finally:
        _cosmos_search.STALE_AFTER = old
    c = store._container()  # type: ignore[attr-defined]
    stale_pk = _cosmos_search.search_pk("customer", "s", "c-42")
    assert list(c.query_items("SELECT * FROM c", partition_key=stale_pk)) == []
    store.close()
    other.close()
