"""A delta read (``query_partition(pk, since=cursor)``) is served by an index over ``(pk, version)``,
so it costs what changed, not the partition's history (issue 15); files and tables of before
get the index when opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from celery_durable.stores import store_from_url
from celery_durable.stores.sqlite.store import SqliteStore
from tests.plugins.postgres import BASE_URL


def _fill(store: Any, pk: str, n: int) -> None:
    for i in range(n):
        store.create({"pk": pk, "id": f"s:{i:06d}", "x": i})


def _delta_statements(store: SqliteStore, pk: str, since: int) -> tuple[list[str], list[str]]:
    """The statements query_partition runs (parameters bound) and the ids it returns."""
    seen: list[str] = []
    with store._conn() as conn:  # the pool hands this connection out again to the read below
        conn.set_trace_callback(seen.append)
    try:
        ids = [d["id"] for d in store.query_partition(pk, since=since).docs]
    finally:
        with store._conn() as conn:
            conn.set_trace_callback(None)
    return [s for s in seen if "FROM docs" in s], ids


def test_sqlite_delta_read_searches_the_changes_index(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(str(path))
    _fill(store, "a", 200)
    _fill(store, "b", 5)
    cursor = store.query_partition("a").cursor
    store.upsert({"pk": "a", "id": "s:000007", "x": -7})
    (statement,), ids = _delta_statements(store, "a", cursor)
    assert ids == ["s:000007"]
    with sqlite3.connect(path) as raw:
        plan = " ".join(str(row[-1]) for row in raw.execute("EXPLAIN QUERY PLAN " + statement))
    assert "docs_changes (pk=? AND version>?)" in plan, plan
    store.close()


def test_sqlite_file_of_before_gets_the_index_on_open(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(str(path))
    _fill(store, "a", 3)
    cursor = store.query_partition("a").cursor
    store.close()
    with sqlite3.connect(path) as raw:  # a file written by schema version 3
        raw.execute("DROP INDEX docs_changes")
        raw.execute("PRAGMA user_version = 3")
    store = SqliteStore(str(path))
    store.upsert({"pk": "a", "id": "s:000001", "x": 10})
    assert [d["id"] for d in store.query_partition("a", since=cursor).docs] == ["s:000001"]
    assert [d["x"] for d in store.query_partition("a").docs] == [0, 10, 2]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 4
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'docs_changes'").fetchone() is not None
    store.close()


def test_postgres_delta_read_uses_the_changes_index(postgres_url: str, postgres_schema: str) -> None:
    store = store_from_url(postgres_url)
    _fill(store, "a", 3)
    store.close()
    t = f'"{postgres_schema}".durable_docs'
    with psycopg.connect(BASE_URL, autocommit=True) as conn:  # a table of before the index
        conn.execute(f'DROP INDEX "{postgres_schema}".durable_docs_changes')
    store = store_from_url(postgres_url)
    cursor = store.query_partition("a").cursor
    store.upsert({"pk": "a", "id": "s:000001", "x": 10})
    assert [d["id"] for d in store.query_partition("a", since=cursor).docs] == ["s:000001"]
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # a tiny table: make the planner show its index choice
        plan = " ".join(
            str(row[0])
            for row in conn.execute(
                f"EXPLAIN SELECT id, body, version FROM {t} WHERE pk = %s AND version >= %s", ("a", int(cursor))
            )
        )
    assert "durable_docs_changes" in plan and "version >=" in plan, plan
    store.close()
