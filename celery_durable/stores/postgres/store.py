"""The PostgreSQL store: ``postgresql://user:password@host:5432/db?table=durable_docs`` (psycopg 3).

Same contract and semantics as the SQLite store (docs/architecture.md §4), for deployments that
already run PostgreSQL or need workers on several hosts. Install with ``celery-durable[postgres]``.

Schema (created on first use, under an advisory lock so processes starting together on a fresh
database do not race): one table (``table=``, default ``durable_docs``, in ``schema=`` if given —
created too — else the connection's ``search_path``) keyed by ``(pk, id)``, ids in the ``"C"``
collation (byte order, as every other backend sorts). The body is ``TEXT``, not ``JSONB``: it
keeps the compact JSON exactly as written and measured by the 2 MB item limit (JSONB reorders
keys, drops duplicate ones and refuses ``\\u0000`` in strings, which JSON and the other backends
allow), and nothing queries inside the body: the fields scans and listings filter on are columns
(``due_kind``/``due_at``; for exec documents ``created``/``workflow``/``status``, and ``search``,
a JSONB ``{attr: [values]}`` behind a GIN index for ``list_execs(search=...)``), each behind a
partial index so :meth:`PostgresStore.scan_due` and :meth:`PostgresStore.list_execs` cost what
they return, not what is stored.

Versions (etags) and the change cursor. SQLite serialises writers, so a counter bumped in each
write transaction grows in commit order. On PostgreSQL writers run concurrently: a value drawn
from a sequence by a transaction that commits *later* than one with a higher value could be
passed by a reader's cursor and missed forever. A counter row updated in every write transaction
would restore commit order, but by serialising every writer of the store on one row lock. Instead
a version is the writing transaction's id (``pg_current_xact_id()``, 64-bit, never reused) times
128, plus the operation's index within a batch (at most 100 ops), so every write of a document
gets a new etag, with no extra statement. The cursor is the ``xmin`` of the reading statement's
own snapshot (``pg_snapshot_xmin(pg_current_snapshot())``, read in the same statement as the
documents): every transaction below it had finished when the snapshot was taken, so its writes
were seen; any write the snapshot missed belongs to a transaction at or above ``xmin`` and is
returned by ``version >= cursor`` next time. A few documents already seen may come again (those
of transactions above ``xmin`` that had committed; more while some long transaction elsewhere
holds ``xmin`` back) — the contract allows that, readers merge by id.

Writes are one autocommit statement each (create: ``INSERT … ON CONFLICT DO NOTHING``, so the
first writer wins; replace and delete check the etag in their ``WHERE``), one round trip. A
:meth:`PostgresStore.batch` is one transaction in one round trip (pipeline mode): its writes, in
id order (row locks in one order: batches never deadlock), each failing the transaction when it
finds no row of the expected version (a cast error, read back as ``ConflictError``) or, for a
create, an existing row (a unique violation); nothing is applied then. Every psycopg error is translated at the boundary
(:func:`.connection.translate`); messages show the URL with its password replaced.
Connections: see :mod:`.connection` (why not ``psycopg_pool``); after ``fork()`` the child
opens its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors as pge

from celery_durable.errors import ConfigurationError, ConflictError
from celery_durable.stores.base import (
    Doc,
    DueRef,
    ExecFilter,
    ExecPage,
    Op,
    PartitionRead,
    Rewrite,
    Store,
    check_ids,
    check_page_size,
    created_key,
    decode_keyset,
    encode_doc,
    rewritten,
    sent_size,
)
from celery_durable.stores.postgres.connection import PgConfig, Pool, parse_url
from celery_durable.stores.push.base import payload_of
from celery_durable.stores.push.postgres import PgNotifier
from celery_durable.stores.search import search_terms, term_of
from celery_durable.stores.sql_rows import decode_row as _decode
from celery_durable.stores.sql_rows import due_columns, exec_page
from celery_durable.stores.sql_rows import parse_etag as _parse_etag
from celery_durable.stores.sql_rows import prefix_upper as _prefix_upper

__all__ = ["PostgresStore", "from_url"]

#: versions per transaction: a batch's ops get ``xid * 128 + index`` (MAX_BATCH_OPS is 100)
_SLOTS = 128
#: the current transaction's first version (assigns it an id if it has none yet)
_XV = f"(pg_current_xact_id()::text::bigint * {_SLOTS})"
#: columns written from a document, after pk and id
_COLS = "body, version, due_kind, due_at, created, workflow, status, search"
_SET = "body = %s, version = {v}, due_kind = %s, due_at = %s, created = %s, workflow = %s, status = %s, search = %s"
_EXCLUDED = ", ".join(f"{c} = excluded.{c}" for c in _COLS.split(", "))
#: what a batch's write that finds no row (of the expected version) casts to an integer: the
#: error aborts the batch's transaction and is read back as a ConflictError
_CONFLICT = "celery_durable_batch_conflict"
#: a rewrite of a missing document whose insert finds it created meanwhile reads it again, this often
_CREATE_ROUNDS = 5


def _checked(write: str) -> str:
    """``write`` (an UPDATE or DELETE of one row) as a statement that fails unless it wrote
    exactly one row. The cast depends on the row count, so it is evaluated at run time only."""
    return (
        f"WITH w AS ({write} RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN 1 "
        f"ELSE ('{_CONFLICT}:' || count(*))::int END FROM w"
    )


Row = tuple[str, str | None, float | None, float | None, str | None, str | None, str | None]


def _conflict(exc: pge.InvalidTextRepresentation, pk: str) -> Exception:
    """A batch write that found no row of the expected version (``_CONFLICT``), as a ConflictError."""
    if _CONFLICT not in str(exc):
        return exc
    return ConflictError(f"batch in {pk!r}: a document does not exist or changed since it was read")


def _prepare(doc: Doc, limit: int) -> Row:
    """Validate a document; return its body and the columns scans and listings filter on."""
    body = encode_doc(doc, limit)  # lone surrogates escaped: TEXT is UTF-8
    kind, at = due_columns(doc)
    if doc["id"] != "exec":
        return body, kind, at, None, None, None, None
    workflow, status = doc.get("workflow"), doc.get("status")
    return (
        body,
        kind,
        at,
        created_key(doc),
        workflow if isinstance(workflow, str) else None,  # list_execs compares with a string
        status if isinstance(status, str) else None,
        _search_column(doc.get("search")),
    )


def _search_column(search: Any) -> str | None:
    """The ``search`` column of an exec row: ``{attr: [values]}`` as JSON (numbers as floats), the
    GIN index answering ``search @> '{"attr": [value]}'`` (stores/search.py)."""
    values: dict[str, list[Any]] = {}
    for attr, _, value in search_terms(search):
        if not (isinstance(value, str) and "\x00" in value):  # JSONB refuses NUL; never valid anyway
            values.setdefault(attr, []).append(value)  # search_terms gave it as term_of does
    return json.dumps(values, separators=(",", ":")) if values else None


def _schema_sql(cfg: PgConfig) -> list[str]:
    t = f'"{cfg.table}"' if cfg.schema is None else f'"{cfg.schema}"."{cfg.table}"'
    return [
        *([] if cfg.schema is None else [f'CREATE SCHEMA IF NOT EXISTS "{cfg.schema}"']),
        f"""CREATE TABLE IF NOT EXISTS {t} (
            pk text COLLATE "C" NOT NULL,
            id text COLLATE "C" NOT NULL,
            body text NOT NULL,
            version bigint NOT NULL,
            due_kind text COLLATE "C",
            due_at double precision,
            created double precision,
            workflow text COLLATE "C",
            status text COLLATE "C",
            search jsonb,
            PRIMARY KEY (pk, id)
        )""",
        f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS search jsonb",  # tables of before search attributes
        # list_execs(search=...): the exec rows holding a value, whatever the history
        f'CREATE INDEX IF NOT EXISTS "{cfg.table}_search" ON {t} USING gin (search jsonb_path_ops)'
        " WHERE id = 'exec' AND search IS NOT NULL",
        # scan_due reads only due rows, in order, from the index
        f'CREATE INDEX IF NOT EXISTS "{cfg.table}_due" ON {t} (due_kind, due_at, pk, id) WHERE due_kind IS NOT NULL',
        # exec rows only, in listing order: list_execs reads one page of the index
        f"CREATE INDEX IF NOT EXISTS \"{cfg.table}_execs\" ON {t} (created DESC, pk DESC) WHERE id = 'exec'",
        # a delta read (query_partition since a cursor) reads only what changed, whatever the history
        f'CREATE INDEX IF NOT EXISTS "{cfg.table}_changes" ON {t} (pk, version)',
    ]


class PostgresStore(Store):
    """The storage contract on one PostgreSQL table, shared by threads, processes and hosts."""

    cross_partition = True

    def __init__(self, cfg: PgConfig) -> None:
        self.cfg = cfg
        self._pool = Pool(cfg)
        self._schema_ready = False
        self._t = t = f'"{cfg.table}"' if cfg.schema is None else f'"{cfg.schema}"."{cfg.table}"'
        self._sql_read = f"SELECT body, version FROM {t} WHERE pk = %s AND id = %s"
        self._sql_insert = f"INSERT INTO {t} (pk, id, {_COLS}) VALUES (%s, %s, %s, {{v}}, %s, %s, %s, %s, %s, %s)"
        self._sql_upsert = self._sql_insert + f" ON CONFLICT (pk, id) DO UPDATE SET {_EXCLUDED}"
        self._sql_update = f"UPDATE {t} SET {_SET} WHERE pk = %s AND id = %s"
        #: exec statuses whose write sends NOTIFY in its transaction (enable_push; push/postgres.py)
        self._push: frozenset[str] = frozenset()
        self._notifier: PgNotifier | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({self.cfg.display!r})"

    def enable_push(self, statuses: frozenset[str]) -> PgNotifier:
        """Send NOTIFY with every write of an exec in ``statuses``; the LISTEN side (stores/push/base.py)."""
        self._push = statuses
        if self._notifier is None:
            self._notifier = PgNotifier(self.cfg)
        return self._notifier

    def _notifies(self, doc: Doc | None) -> bool:
        return bool(self._push) and doc is not None and doc["id"] == "exec" and doc.get("status") in self._push

    def _with_notify(self, doc: Doc, sql: str, params: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
        """``sql`` (``… RETURNING version``), NOTIFYing in its transaction if it writes a row."""
        if not self._notifies(doc):
            return sql, params
        return f"WITH w AS ({sql}) SELECT version, pg_notify(%s, %s) FROM w", (*params, *self._note(doc["pk"]))

    def _note(self, pk: str) -> tuple[str, str]:
        assert self._notifier is not None  # _notifies: enable_push made it
        return self._notifier.channel, payload_of(pk)

    # connections ------------------------------------------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        with self._pool.connection() as conn:
            if not self._schema_ready:
                self._init_schema(conn)
            yield conn

    def _init_schema(self, conn: psycopg.Connection[Any]) -> None:
        cfg = self.cfg
        names = [
            # quoted as created: to_regclass folds an unquoted "MixedCase" name to lower case
            f'"{cfg.schema}"."{n}"' if cfg.schema else f'"{n}"'
            for n in (cfg.table, *(f"{cfg.table}_{i}" for i in ("due", "execs", "search", "changes")))
        ]
        # the objects may exist already, created by someone allowed to (CREATE … IF NOT EXISTS
        # checks the right to create before it looks)
        row = conn.execute(f"SELECT {', '.join(['to_regclass(%s)'] * len(names))}", names).fetchone()
        if row is None or any(r is None for r in row):
            with conn.transaction():
                # CREATE … IF NOT EXISTS is not safe against a concurrent identical CREATE
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"celery_durable:{self._t}",))
                for statement in _schema_sql(cfg):
                    conn.execute(statement)
        self._schema_ready = True

    def reopen(self) -> None:
        self._pool.clear()

    def close(self) -> None:
        self._pool.clear()

    # single-document operations ------------------------------------------------------------

    def read(self, pk: str, doc_id: str) -> Doc | None:
        with self._conn() as conn:
            row = conn.execute(self._sql_read, (pk, doc_id)).fetchone()
        return None if row is None else _decode(row[0], pk, doc_id, row[1])

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        unique = list(dict.fromkeys(wanted))
        if not unique:
            return []
        with self._conn() as conn:
            cur = conn.execute(f"SELECT id, body, version FROM {self._t} WHERE pk = %s AND id = ANY(%s)", (pk, unique))
            rows = {str(doc_id): (body, version) for doc_id, body, version in cur}
        # decoded per position, as read() would: a repeated id gets its own copy
        return [None if (row := rows.get(doc_id)) is None else _decode(row[0], pk, doc_id, row[1]) for doc_id in wanted]

    def create(self, doc: Doc) -> str | None:
        body, *cols = _prepare(doc, self.max_doc_bytes)
        sql = self._sql_insert.format(v=_XV) + " ON CONFLICT (pk, id) DO NOTHING RETURNING version"
        with self._conn() as conn:
            row = conn.execute(*self._with_notify(doc, sql, (doc["pk"], doc["id"], body, *cols))).fetchone()
        return None if row is None else str(row[0])  # None: the first writer won

    def replace(self, doc: Doc, if_match: str | None) -> str:
        body, *cols = _prepare(doc, self.max_doc_bytes)
        expected = _parse_etag(if_match)
        sql = self._sql_update.format(v=_XV) + ("" if expected is None else " AND version = %s") + " RETURNING version"
        params = (body, *cols, doc["pk"], doc["id"], *(() if expected is None else (expected,)))
        with self._conn() as conn:
            # the etag check and the write in one statement: of racing replaces one matches
            row = conn.execute(*self._with_notify(doc, sql, params)).fetchone()
            if row is None:
                exists = conn.execute(self._sql_read, (doc["pk"], doc["id"])).fetchone() is not None
        if row is None:
            raise ConflictError(f"{doc['id']!r} " + ("changed since it was read" if exists else "does not exist"))
        return str(row[0])

    def upsert(self, doc: Doc) -> str:
        body, *cols = _prepare(doc, self.max_doc_bytes)
        with self._conn() as conn:
            sql = self._sql_upsert.format(v=_XV) + " RETURNING version"
            row = conn.execute(*self._with_notify(doc, sql, (doc["pk"], doc["id"], body, *cols))).fetchone()
        assert row is not None
        return str(row[0])

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        expected = _parse_etag(if_match)
        sql = f"DELETE FROM {self._t} WHERE pk = %s AND id = %s" + ("" if expected is None else " AND version = %s")
        with self._conn() as conn:
            cur = conn.execute(sql, (pk, doc_id, *(() if expected is None else (expected,))))
            if cur.rowcount == 1:
                return True
            if expected is None:
                return False
            exists = conn.execute(self._sql_read, (pk, doc_id)).fetchone() is not None
        if exists:
            raise ConflictError(f"{doc_id!r} changed since it was read")
        return False

    # partition operations ------------------------------------------------------------------

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        try:
            after = int(since or 0)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"not a cursor of this store: {since!r}") from exc
        # One statement, one snapshot: the cursor is the xmin of the snapshot the rows were read
        # in (the row with a NULL id), so nothing committed below it was missed (module docstring).
        sql = (
            f"SELECT NULL, NULL, pg_snapshot_xmin(pg_current_snapshot())::text::bigint * {_SLOTS}"
            f" UNION ALL SELECT id, body, version FROM {self._t} WHERE pk = %s"
            + (" AND version >= %s" if after else "")
        )
        with self._conn() as conn:
            rows = conn.execute(sql, (pk, after) if after else (pk,)).fetchall()
        cursor = next(int(v) for doc_id, _, v in rows if doc_id is None)
        found = sorted((r for r in rows if r[0] is not None), key=lambda r: str(r[0]))
        return PartitionRead(
            docs=[_decode(body, pk, doc_id, version) for doc_id, body, version in found], cursor=cursor
        )

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        prepared = self._prepare_batch(pk, ops)
        if not ops:
            return []
        with self._conn() as conn:
            try:
                return self._batch(conn, pk, ops, prepared)
            except BaseException:
                # a failed write aborted the transaction: end it (the connection goes back idle).
                # rollback(), not execute("ROLLBACK"): it also makes psycopg forget its prepared
                # statements (DEALLOCATE ALL), among them those whose PREPARE the server skipped
                # after the failed write, which psycopg would otherwise use next time
                if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    conn.rollback()
                raise

    def _prepare_batch(self, pk: str, ops: Sequence[Op]) -> list[Row | None]:
        self._check_batch(pk, ops, check_docs=False)  # _prepare checks each document
        prepared = [_prepare(op.doc, self.max_doc_bytes) if op.doc is not None else None for op in ops]
        self._check_batch_bytes(pk, ops, [sent_size(p[0]) if p is not None else 0 for p in prepared])
        return prepared

    def _batch(
        self, conn: psycopg.Connection[Any], pk: str, ops: Sequence[Op], prepared: list[Row | None]
    ) -> list[str | None]:
        # One round trip (pipeline mode): BEGIN, the first version, every write and COMMIT are
        # sent together. Each write checks itself: a create fails on the primary key, a replace or
        # delete that finds no row of the expected version fails a cast (_CONFLICT), which aborts
        # the transaction; the server skips the rest, COMMIT included, and nothing is applied.
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                first = conn.execute(f"SELECT {_XV}")
                self._queue_ops(conn, pk, ops, prepared)
                if any(self._notifies(op.doc) for op in ops):  # delivered at COMMIT, never before the data
                    conn.execute("SELECT pg_notify(%s, %s)", self._note(pk))
                conn.execute("COMMIT")
            row = first.fetchone()
        except pge.InvalidTextRepresentation as exc:
            raise _conflict(exc, pk) from None
        assert row is not None
        base = int(row[0])
        return [None if op.kind == "delete" else str(base + i) for i, op in enumerate(ops)]

    def _queue_ops(self, conn: psycopg.Connection[Any], pk: str, ops: Sequence[Op], prepared: list[Row | None]) -> None:
        """A batch's writes, in id order (row locks are taken in one order: two batches never wait
        in a circle). Statements are prepared once used often (psycopg's threshold: PostgreSQL then
        skips parsing and planning, ~40% of its CPU per batch); a prepare that an aborted pipeline
        skipped is forgotten by the caller's rollback."""
        ids = [op.doc_id for op in ops]
        for i in sorted(range(len(ops)), key=lambda i: ids[i]):
            op, prep = ops[i], prepared[i]
            expected = _parse_etag(op.if_match)
            check = "" if expected is None else " AND version = %s"
            where = (pk, op.doc_id) + (() if expected is None else (expected,))
            if op.kind == "delete":
                conn.execute(_checked(f"DELETE FROM {self._t} WHERE pk = %s AND id = %s{check}"), where)
                continue
            assert prep is not None
            body, *cols = prep
            version = f"{_XV} + {i}"
            if op.kind == "create":  # an existing row (a concurrent creator's too): unique violation
                conn.execute(self._sql_insert.format(v=version), (pk, op.doc_id, body, *cols))
            elif op.kind == "upsert":
                conn.execute(self._sql_upsert.format(v=version), (pk, op.doc_id, body, *cols))
            else:
                conn.execute(_checked(self._sql_update.format(v=version) + check), (body, *cols, *where))

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        self._check_rewrites(pk, ops, also)
        prepared = self._prepare_batch(pk, ops)
        with self._conn() as conn:
            try:
                out, etags = self._batch_with(conn, pk, ops, prepared, also)
            except BaseException:
                # a failed write (INERROR) or an update that raised (INTRANS): nothing is applied
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
                raise
        for rewrite, etag in zip(also, etags, strict=True):
            rewrite.etag = etag
        return out

    def _batch_with(
        self,
        conn: psycopg.Connection[Any],
        pk: str,
        ops: Sequence[Op],
        prepared: list[Row | None],
        also: Sequence[Rewrite],
    ) -> tuple[list[str | None], list[str | None]]:
        # Two round trips: BEGIN, the first version, the ops as batch() sends them and each
        # rewrite's document read locked (FOR UPDATE: a concurrent rewrite of it waits for this
        # transaction); then the rewritten documents, the notifies and COMMIT. A rewrite of a
        # missing document costs more (its create may race another's: _rewrite).
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                first = conn.execute(f"SELECT {_XV}")
                self._queue_ops(conn, pk, ops, prepared)
                locked = [conn.execute(self._sql_read + " FOR UPDATE", (r.pk, r.id)) for r in also]
            row = first.fetchone()
        except pge.InvalidTextRepresentation as exc:
            raise _conflict(exc, pk) from None
        assert row is not None
        base = int(row[0])
        notify = {pk} if any(self._notifies(op.doc) for op in ops) else set()
        etags: list[str | None] = []
        writes: list[tuple[Any, ...]] = []
        for j, (rewrite, cur) in enumerate(zip(also, locked, strict=True)):
            version = base + len(ops) + j
            found = cur.fetchone()
            if found is None:  # no row to lock
                doc = self._rewrite(conn, rewrite, version)
            else:
                new = rewrite.update(_decode(found[0], rewrite.pk, rewrite.id, found[1]))
                doc = None if new is None else rewritten(rewrite, new)
                if doc is not None:
                    body, *cols = _prepare(doc, self.max_doc_bytes)
                    writes.append((body, version, *cols, rewrite.pk, rewrite.id))
            etags.append(None if doc is None else str(version))
            if self._notifies(doc):
                notify.add(rewrite.pk)
        with conn.pipeline():
            for params in writes:
                conn.execute(self._sql_update.format(v="%s"), params)
            for one in sorted(notify):  # delivered at COMMIT, never before the data
                conn.execute("SELECT pg_notify(%s, %s)", self._note(one))
            conn.execute("COMMIT")
        return [None if op.kind == "delete" else str(base + i) for i, op in enumerate(ops)], etags

    def _rewrite(self, conn: psycopg.Connection[Any], rewrite: Rewrite, version: int) -> Doc | None:
        """Read ``rewrite``'s document locked (``FOR UPDATE``: a concurrent rewrite of it waits for
        this transaction), update and write it; the document written, or ``None``."""
        for _ in range(_CREATE_ROUNDS):
            row = conn.execute(self._sql_read + " FOR UPDATE", (rewrite.pk, rewrite.id)).fetchone()
            new = rewrite.update(None if row is None else _decode(row[0], rewrite.pk, rewrite.id, row[1]))
            if new is None:
                return None
            doc = rewritten(rewrite, new)
            body, *cols = _prepare(doc, self.max_doc_bytes)
            if row is not None:  # locked: nobody changes or deletes it before this transaction ends
                conn.execute(self._sql_update.format(v="%s"), (body, version, *cols, rewrite.pk, rewrite.id))
                return doc
            # no row to lock: a concurrent creator's insert makes this one wait for its outcome,
            # then do nothing (read it again, locked, and update what it wrote)
            sql = self._sql_insert.format(v="%s") + " ON CONFLICT (pk, id) DO NOTHING RETURNING version"
            if conn.execute(sql, (rewrite.pk, rewrite.id, body, version, *cols)).fetchone() is not None:
                return doc
        raise ConflictError(f"rewrite of {rewrite.pk!r}/{rewrite.id!r}: created and deleted under every try")

    # scans ------------------------------------------------------------------------------------

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT pk, id, due_at FROM {self._t} WHERE due_kind = %s AND due_kind IS NOT NULL"
                " AND due_at <= %s ORDER BY due_kind, due_at, pk, id LIMIT %s",
                (kind, float(now), int(limit)),
            ).fetchall()
        return [DueRef(pk, doc_id, float(at)) for pk, doc_id, at in rows]

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        upper = _prefix_upper(pk_prefix)
        sql = f"SELECT pk FROM {self._t} WHERE id = 'exec' AND pk >= %s AND starts_with(pk, %s)"
        params: list[Any] = [pk_prefix, pk_prefix]
        if upper is not None:
            sql += " AND pk < %s"
            params.append(upper)
        sql += " ORDER BY pk LIMIT %s"
        params.append(int(limit))
        with self._conn() as conn:
            return [str(pk) for (pk,) in conn.execute(sql, params)]

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        check_page_size(limit)
        sql, params = self._list_sql(flt or ExecFilter(), limit, cursor)
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return exec_page(rows, limit)

    def _list_sql(self, flt: ExecFilter, limit: int, cursor: str | None) -> tuple[str, list[Any]]:
        sql = f"SELECT pk, body, version, created FROM {self._t} WHERE id = 'exec'"
        params: list[Any] = []
        for column, value in (("workflow", flt.workflow), ("status", flt.status)):
            if value is not None:
                sql += f" AND {column} = %s"
                params.append(value)
        if flt.created_after is not None:
            sql += " AND created >= %s"
            params.append(float(flt.created_after))
        if flt.created_before is not None:
            sql += " AND created < %s"
            params.append(float(flt.created_before))
        for attr, value in (flt.search or {}).items():
            sql += " AND search IS NOT NULL AND search @> %s::jsonb"
            params.append(json.dumps({attr: [term_of(value)[1]]}, separators=(",", ":")))
        if cursor is not None:
            sql += " AND (created, pk) < (%s, %s)"
            params += list(decode_keyset(cursor))
        # with a search filter, order by expressions the listing index cannot serve: the planner then
        # reads the GIN index (the value's executions) rather than walk every execution in order
        sql += " ORDER BY created + 0 DESC, pk || '' DESC" if flt.search else " ORDER BY created DESC, pk DESC"
        params.append(limit + 1)
        return sql + " LIMIT %s", params


def from_url(url: str, **options: Any) -> PostgresStore:
    """``postgresql://user:password@host:5432/dbname`` (or ``postgres://``), libpq's URL form.

    Store options (URL query or keyword): ``table`` (default ``durable_docs``), ``schema`` (created
    if missing; default: the ``search_path``), ``pool_max`` — connections in use at once per
    process (default 10), ``connect_timeout`` — seconds to connect or wait for a free connection
    (default 10). Every other query parameter goes to libpq (``sslmode``, ``application_name``…).
    Example: ``postgresql://app:secret@db.internal/app?schema=durable&sslmode=require``.
    """
    return PostgresStore(parse_url(url, dict(options)))
