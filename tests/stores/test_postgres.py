"""PostgreSQL specifics (the shared contract is tests/stores/test_contract.py, run on it too)."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import psycopg
import pytest

from celery_durable.errors import ConfigurationError, CorruptDocument, StoreUnavailable
from celery_durable.stores import store_from_url
from celery_durable.stores.base import CORRUPT_KEY
from celery_durable.stores.postgres.store import PostgresStore
from tests.plugins.postgres import BASE_URL
from tests.plugins.workers import wait_until


def raw() -> psycopg.Connection[Any]:
    return psycopg.connect(BASE_URL, autocommit=True)


def test_url_forms_options_and_redaction(postgres_url: str, postgres_schema: str) -> None:
    store = store_from_url(postgres_url.replace("postgresql://", "postgres://") + "&table=my_docs&pool_max=3")
    assert isinstance(store, PostgresStore) and store.cfg.table == "my_docs" and store.cfg.pool_max == 3
    store.create({"pk": "p", "id": "a"})
    with raw() as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{postgres_schema}.my_docs",)).fetchone() != (None,)
    store.close()
    secret = store_from_url("postgresql://app:s3cr%21t@127.0.0.1:1/db?connect_timeout=2")
    assert "s3cr" not in repr(secret) and "***" in repr(secret)
    with pytest.raises(StoreUnavailable) as err:
        secret.read("p", "a")
    assert "s3cr" not in str(err.value) and "cannot connect" in str(err.value)
    for bad, match in [
        ({"pool_size": 3}, "unknown postgresql store option"),
        ({"table": "x; drop"}, "table must be"),
        ({"pool_max": 0}, "pool_max"),
        ({"connect_timeout": "soon"}, "numbers"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            store_from_url(postgres_url, **bad)
    with pytest.raises(ConfigurationError, match="invalid postgresql URL"):
        store_from_url(postgres_url + "&no_such_libpq_param=1")


def test_cursor_never_misses_a_write_that_commits_after_a_newer_one(postgres_url: str, postgres_schema: str) -> None:
    """A transaction that started (and took its id) first but commits last must still be seen."""
    store = store_from_url(postgres_url)
    store.create({"pk": "p", "id": "first"})
    t = f'"{postgres_schema}"."durable_docs"'
    with raw() as slow:
        slow.execute("BEGIN")
        slow.execute(
            f"INSERT INTO {t} (pk, id, body, version) VALUES"
            ' (\'p\', \'late\', \'{"pk":"p","id":"late"}\', pg_current_xact_id()::text::bigint * 128)'
        )
        store.create({"pk": "p", "id": "early"})  # a newer transaction, committed first
        before = store.query_partition("p")
        assert {d["id"] for d in before.docs} == {"first", "early"}
        slow.execute("COMMIT")
    after = store.query_partition("p", since=before.cursor)
    assert "late" in {d["id"] for d in after.docs}
    store.close()


def test_a_connection_closed_by_the_server_is_replaced_without_an_error(postgres_url: str) -> None:
    store = store_from_url(postgres_url + "&application_name=durable_kill_me")
    store.create({"pk": "p", "id": "a"})
    with raw() as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'durable_kill_me'"
        ).fetchone()
        assert killed == (1,)
        # pg_terminate_backend only signals the backend: wait until it has closed the socket
        wait_until(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'durable_kill_me'"
                ).fetchone()
                == (0,)
            ),
            what="the backend to exit",
        )
    assert store.read("p", "a") is not None  # the pooled connection is dead: a new one is used
    store.close()


def _child(store: PostgresStore, results: Any) -> None:
    try:
        results.put(store.create({"pk": "p", "id": "child"}) is not None)
    except BaseException as exc:  # noqa: B036 - reported to the parent
        results.put(repr(exc))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_store_keeps_working_in_parent_and_child_after_fork(postgres_url: str) -> None:
    store = store_from_url(postgres_url)
    assert isinstance(store, PostgresStore)
    store.create({"pk": "p", "id": "before"})
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(store, results))
    child.start()
    assert results.get(timeout=60) is True
    child.join(timeout=60)
    # the child did not use (nor close) the parent's connection
    assert store.create({"pk": "p", "id": "after"}) is not None
    assert {d["id"] for d in store.query_partition("p").docs} == {"before", "child", "after"}
    store.close()


def test_a_corrupt_body_is_reported_and_listed_as_corrupt(postgres_url: str, postgres_schema: str) -> None:
    store = store_from_url(postgres_url)
    store.create({"pk": "e1", "id": "exec", "created_at": 1.0})
    store.create({"pk": "e2", "id": "exec", "created_at": 2.0})
    with raw() as conn:
        conn.execute(f"UPDATE \"{postgres_schema}\".durable_docs SET body = '{{nope' WHERE pk = 'e2'")
    with pytest.raises(CorruptDocument):
        store.read("e2", "exec")
    docs = store.list_execs().docs
    assert [d["pk"] for d in docs] == ["e2", "e1"] and CORRUPT_KEY in docs[0] and CORRUPT_KEY not in docs[1]
    store.close()


def test_scans_and_listing_use_their_partial_indexes(postgres_url: str, postgres_schema: str) -> None:
    store = store_from_url(postgres_url)
    store.create({"pk": "e1", "id": "exec", "due_kind": "lease", "due_at": 1.0, "created_at": 1.0})
    t = f'"{postgres_schema}".durable_docs'
    with raw() as conn:
        conn.execute("SET enable_seqscan = off")  # a tiny table: make the planner show its index choice
        conn.execute("SET enable_bitmapscan = off")
        due = conn.execute(
            f"EXPLAIN SELECT pk, id, due_at FROM {t} WHERE due_kind = 'lease' AND due_kind IS NOT NULL"
            " AND due_at <= 5 ORDER BY due_kind, due_at, pk, id LIMIT 100"
        ).fetchall()
        execs = conn.execute(
            f"EXPLAIN SELECT pk FROM {t} WHERE id = 'exec' ORDER BY created DESC, pk DESC LIMIT 10"
        ).fetchall()
    assert "durable_docs_due" in str(due) and "Sort" not in str(due), due
    assert "durable_docs_execs" in str(execs) and "Sort" not in str(execs), execs
    store.close()


def test_batches_that_conflict_again_and_again_stay_conflicts(postgres_url: str) -> None:
    """A batch fails inside its one round trip (pipeline); psycopg prepares a statement run
    often, and a prepare sent in an aborted pipeline never happened: the next batch then used a
    statement the server did not have (InvalidSqlStatementName, a StoreError instead of a
    ConflictError, under racing completions)."""
    from celery_durable.errors import ConflictError
    from celery_durable.stores.base import Op

    store = store_from_url(postgres_url)
    try:
        etag = store.create({"pk": "b", "id": "x", "n": 0})
        assert etag is not None
        for n in range(1, 15):
            with pytest.raises(ConflictError):  # a stale etag: the update finds no row
                store.batch(
                    "b", [Op.create({"pk": "b", "id": f"r{n}"}), Op.replace({"pk": "b", "id": "x", "n": n}, "1")]
                )
            with pytest.raises(ConflictError):  # an existing id: the insert fails
                store.batch("b", [Op.create({"pk": "b", "id": "x"})])
            etag = store.batch(
                "b", [Op.create({"pk": "b", "id": f"r{n}"}), Op.replace({"pk": "b", "id": "x", "n": n}, etag)]
            )[1]
        doc = store.read("b", "x")
        assert doc is not None and doc["n"] == 14
    finally:
        store.close()


def _prepared_on(store: Any) -> int:
    """Statements the server holds prepared on the connection the store's next call uses."""
    assert isinstance(store, PostgresStore)
    with store._pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone()
    return int(row[0]) if row else 0


def test_a_batch_run_often_is_prepared_and_a_conflict_forgets_the_prepared(postgres_url: str) -> None:
    """A step's batch is parsed and planned once per connection (PostgreSQL's CPU per batch fell by
    ~40%), and a conflict in the one round trip makes psycopg and the server forget every prepared
    statement together, so none it skipped is used later."""
    from celery_durable.errors import ConflictError
    from celery_durable.stores.base import Op

    store = store_from_url(postgres_url)
    try:
        etag = store.create({"pk": "p", "id": "x", "n": 0})
        for n in range(1, 10):
            etag = store.batch(
                "p", [Op.create({"pk": "p", "id": f"r{n}"}), Op.replace({"pk": "p", "id": "x", "n": n}, etag)]
            )[1]
        assert _prepared_on(store) >= 2  # the insert and the checked update, at least
        with pytest.raises(ConflictError):
            store.batch("p", [Op.create({"pk": "p", "id": "r1"})])
        assert _prepared_on(store) == 0
        etag = store.batch("p", [Op.replace({"pk": "p", "id": "x", "n": 10}, etag)])[0]
        doc = store.read("p", "x")
        assert doc is not None and doc["n"] == 10
    finally:
        store.close()
