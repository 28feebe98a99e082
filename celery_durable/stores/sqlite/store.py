"""The embedded default store: one SQLite file in WAL mode (docs/architecture.md §4).

Several Celery worker processes (and their threads) may share one file. Every write runs in a
``BEGIN IMMEDIATE`` transaction, so writers are serialised by SQLite's own file lock and the
first writer of an id wins across processes; readers never block writers (WAL). A writer waits
for the lock in short sleeps of its own, not SQLite's busy handler (:meth:`SqliteStore._begin`).

Schema: one ``docs`` table keyed by ``(pk, id)`` holding the JSON body, a ``version`` drawn from
a global sequence (``meta.seq``) and the ``due_kind``/``due_at`` columns. Because versions are
assigned inside the serialised write transaction they grow in commit order, so a version is at
once the etag and a change cursor for :meth:`SqliteStore.query_partition`. A partial index over
``(due_kind, due_at)`` restricted to ``due_kind IS NOT NULL`` makes :meth:`SqliteStore.scan_due`
cost what is due, not what is stored; an index over ``(pk, version)`` makes a delta read
(``query_partition(pk, since=cursor)``) cost what changed, not the partition's history.

Connections come from a small per-process pool (one connection is used by one thread at a
time). After ``fork()`` the pool is dropped, either by :meth:`SqliteStore.reopen` or when a
process-id change is noticed, without closing the inherited handles (SQLite forbids using them
in the child, closing them included).
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from celery_durable.errors import ConfigurationError, ConflictError, StoreUnavailable
from celery_durable.settings import redact_url
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
    decode_keyset,
    sent_size,
)
from celery_durable.stores.sql_rows import decode_row as _decode
from celery_durable.stores.sql_rows import exec_page
from celery_durable.stores.sql_rows import parse_etag as _parse_etag
from celery_durable.stores.sql_rows import prefix_upper as _prefix_upper
from celery_durable.stores.sqlite.files import DEFAULT_FILE_MODE, check_file_mode, create_file
from celery_durable.stores.sqlite.search import SEARCH_SCHEMA, index_search, search_query
from celery_durable.stores.sqlite.writes import UPSERT, Prepared, allocate, apply_ops, apply_rewrites, prepare

__all__ = ["SqliteStore", "from_url", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_FILE_MODE"]

#: seconds a connection waits for another writer's lock before giving up
DEFAULT_BUSY_TIMEOUT = 5.0
#: idle connections kept per process and kind (reader, writer); extra ones are closed when released
MAX_IDLE_CONNECTIONS = 8
#: first and longest sleep (seconds) between tries for the write lock; see SqliteStore._begin
WAIT_FIRST = 100e-6
WAIT_MAX = 2e-3
#: WAL pages after which a commit checkpoints (SQLite's default: 1,000). Every commit rewrites the
#: same few hot pages (the version counter, index pages, the partition's leaf); a checkpoint copies
#: each distinct page once and syncs the files, so checkpoints 4x rarer copy the hot pages and sync
#: 4x less often. bench/long.py's loop on a quiet machine: 0.91-0.98 -> 0.80-0.84 ms of CPU per
#: activity step (two runs each; under load the difference drowns in noise). The cost: a WAL file
#: of up to ~16 MB (4 KB pages) between checkpoints.
WAL_AUTOCHECKPOINT = 4000
#: ids per ``IN (...)`` of read_many (SQLite before 3.32 allows 999 parameters a statement)
_IN_CHUNK = 500
#: 2: the docs_execs index (list_execs); 3: search_idx; 4: docs_changes; older files are upgraded on open
SCHEMA_VERSION = 4

#: An exec row's listing key: its numeric created_at, else 0. Guarded by json_valid so a corrupt
#: body is listed (and flagged) rather than failing the whole query; must match docs_execs exactly.
_CREATED = (
    "(CASE WHEN json_valid(body) AND json_type(body, '$.created_at') IN ('integer', 'real')"
    " THEN json_extract(body, '$.created_at') ELSE 0 END)"
)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS docs (
        pk TEXT NOT NULL,
        id TEXT NOT NULL,
        body TEXT NOT NULL,
        version INTEGER NOT NULL,
        due_kind TEXT,
        due_at REAL,
        PRIMARY KEY (pk, id)
    )""",
    # covering partial index: scan_due reads only due rows and never touches the table
    """CREATE INDEX IF NOT EXISTS docs_due ON docs (due_kind, due_at, pk, id)
        WHERE due_kind IS NOT NULL""",
    # exec rows only, in listing order: list_execs reads one page of the index, whatever the history
    f"CREATE INDEX IF NOT EXISTS docs_execs ON docs ({_CREATED}, pk) WHERE id = 'exec'",
    # a delta read (query_partition since a cursor) reads only what changed, whatever the history
    "CREATE INDEX IF NOT EXISTS docs_changes ON docs (pk, version)",
    # the exec documents' search attributes (stores/sqlite/search.py), written with the exec
    *SEARCH_SCHEMA,
    "CREATE TABLE IF NOT EXISTS meta (k INTEGER PRIMARY KEY CHECK (k = 0), seq INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (k, seq) VALUES (0, 0)",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)


def _unavailable(exc: sqlite3.Error, path: str) -> StoreUnavailable:
    return StoreUnavailable(f"sqlite store {path!r}: {exc}")


class SqliteStore(Store):
    """The storage contract on one SQLite file, shared by threads and processes."""

    _wait_first = WAIT_FIRST
    _wait_max = WAIT_MAX
    cross_partition = True

    def __init__(
        self, path: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, file_mode: int = DEFAULT_FILE_MODE
    ) -> None:
        if not path or path == ":memory:" or path.startswith("file::memory:"):
            raise ConfigurationError("the sqlite store needs a file path (an in-memory database is not shared)")
        if busy_timeout < 0:
            raise ConfigurationError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        self.path = path
        self.busy_timeout = float(busy_timeout)
        self.file_mode = check_file_mode(file_mode)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []  # readers: SQLite's busy handler waits for them
        self._idle_writers: list[sqlite3.Connection] = []  # no busy handler: _begin waits for the lock
        self._pid = os.getpid()
        self._schema_ready = False
        # handles inherited across fork(): kept referenced so they are never finalised here
        self._abandoned: list[sqlite3.Connection] = []

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    # connections ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not self._schema_ready:  # 0600, not SQLite's 0644 (stores/sqlite/files.py)
            create_file(self.path, self.file_mode)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}")
            if not self._schema_ready:
                self._init_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL takes an exclusive lock and may answer SQLITE_BUSY without waiting
        # on the busy handler when several processes open a fresh file at once: retry.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version != SCHEMA_VERSION:
            if version > SCHEMA_VERSION:
                raise ConfigurationError(
                    f"{self.path!r} has schema version {version}; this celery_durable knows {SCHEMA_VERSION}"
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._schema_ready = True

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections and its lock (maybe held there)."""
        self._lock = threading.Lock()
        self._abandoned.extend(self._idle + self._idle_writers)
        self._idle, self._idle_writers = [], []
        self._pid = os.getpid()

    @contextmanager
    def _conn(self, writer: bool = False) -> Iterator[sqlite3.Connection]:
        """A pooled connection (a writer's has no busy handler); sqlite3 errors leave as :class:`StoreUnavailable`."""
        if os.getpid() != self._pid:
            self._after_fork()
        with self._lock:
            idle = self._idle_writers if writer else self._idle
            conn = idle.pop() if idle else None
            pid = self._pid
        try:
            if conn is None:
                conn = self._connect()
                if writer:
                    conn.execute("PRAGMA busy_timeout = 0")
            yield conn
        except sqlite3.Error as exc:
            if conn is not None:
                self._discard(conn)
                conn = None
            raise _unavailable(exc, self.path) from exc
        finally:
            if conn is not None:
                self._release(conn, pid, writer)

    def _release(self, conn: sqlite3.Connection, pid: int, writer: bool) -> None:
        if conn.in_transaction:  # an exception escaped mid-transaction
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                self._discard(conn)
                return
        with self._lock:
            idle = self._idle_writers if writer else self._idle
            if pid == self._pid == os.getpid() and len(idle) < MAX_IDLE_CONNECTIONS:
                idle.append(conn)
                return
        if pid == os.getpid():
            conn.close()

    @staticmethod
    def _discard(conn: sqlite3.Connection) -> None:
        try:
            conn.close()
        except sqlite3.Error:
            pass

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the file's write lock up front."""
        with self._conn(writer=True) as conn:
            self._begin(conn)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            # WAL: the COMMIT of an IMMEDIATE transaction takes no further lock and was never seen
            # busy (27,000 contended commits); were it, the transaction stays open and may retry.
            self._retry_busy(conn, "COMMIT")

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting up to ``busy_timeout`` for another writer's lock.

        Why not SQLite's busy handler (``timeout=``, kept for readers): it sleeps 1, 2, 5, 10, 15,
        20, 25 … ms between tries, while a write transaction holds the lock for ~0.1–0.3 ms, so
        a waiter sleeps on long after the lock is free again, and a writer that commits and comes
        straight back keeps winning. ``bench/sqlite_contention.py``, 9 processes with 2 ms between
        their writes (5 runs on a busy 2-core machine): p99 4–15 ms instead of 19–56, the worst
        17–33 ms instead of 81–340, writes/s +25–50 %; back to back, writes/s even (-25 to +35 %
        by round) and the worst 50–80 ms instead of 330–760. So a writer's connection has no busy
        handler and retries after short randomized sleeps (jitter spreads the waiters). A failed
        ``BEGIN IMMEDIATE`` takes and changes nothing, so it is safe to retry; at the deadline the
        last "database is locked" error is raised, as SQLite's handler did.
        """
        self._retry_busy(conn, "BEGIN IMMEDIATE")

    def _retry_busy(self, conn: sqlite3.Connection, sql: str) -> None:
        """Execute ``sql``; on SQLITE_BUSY sleep 50–100 % of a wait doubling from WAIT_FIRST to
        WAIT_MAX and try again, for up to ``busy_timeout`` (then raise the last error)."""
        deadline = time.monotonic() + self.busy_timeout
        wait = self._wait_first
        while True:
            try:
                conn.execute(sql)
                return
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            time.sleep(min(left, wait * random.uniform(0.5, 1.0)))
            wait = min(wait * 2, self._wait_max)

    def reopen(self) -> None:
        if os.getpid() != self._pid:
            self._after_fork()
            return
        with self._lock:
            idle = self._idle + self._idle_writers
            self._idle, self._idle_writers = [], []
        for conn in idle:
            self._discard(conn)

    def close(self) -> None:
        self.reopen()

    # single-document operations ------------------------------------------------------------

    def read(self, pk: str, doc_id: str) -> Doc | None:
        with self._conn() as conn:
            row = conn.execute("SELECT body, version FROM docs WHERE pk = ? AND id = ?", (pk, doc_id)).fetchone()
        return None if row is None else _decode(row[0], pk, doc_id, row[1])

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        unique = list(dict.fromkeys(wanted))
        if not unique:
            return []
        chunks = [unique[i : i + _IN_CHUNK] for i in range(0, len(unique), _IN_CHUNK)]
        rows: dict[str, tuple[str, int]] = {}
        with self._conn() as conn:
            if len(chunks) > 1:
                conn.execute("BEGIN")  # one snapshot across the statements (released on error)
            for chunk in chunks:
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT id, body, version FROM docs WHERE pk = ? AND id IN ({marks})"
                rows.update((str(doc_id), (body, version)) for doc_id, body, version in conn.execute(sql, (pk, *chunk)))
            if len(chunks) > 1:
                conn.execute("COMMIT")
        # decoded per position, as read() would: a repeated id gets its own copy
        return [None if (row := rows.get(doc_id)) is None else _decode(row[0], pk, doc_id, row[1]) for doc_id in wanted]

    def create(self, doc: Doc) -> str | None:
        body, kind, at = prepare(doc, self.max_doc_bytes)
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO docs (pk, id, body, version, due_kind, due_at)"
                " VALUES (?, ?, ?, (SELECT seq + 1 FROM meta WHERE k = 0), ?, ?)"
                " ON CONFLICT (pk, id) DO NOTHING",
                (doc["pk"], doc["id"], body, kind, at),
            )
            if cur.rowcount == 0:
                return None  # first writer won; the empty transaction just commits
            version = allocate(conn)
            index_search(conn, doc)
        return str(version)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        body, kind, at = prepare(doc, self.max_doc_bytes)
        expected = _parse_etag(if_match)
        with self._write() as conn:
            version = allocate(conn)
            # the etag check and the write in one statement (a failed one rolls the allocation back)
            cur = conn.execute(
                "UPDATE docs SET body = ?, version = ?, due_kind = ?, due_at = ? WHERE pk = ? AND id = ?"
                + ("" if expected is None else " AND version = ?"),
                (body, version, kind, at, doc["pk"], doc["id"], *(() if expected is None else (expected,))),
            )
            if cur.rowcount != 1:
                exists = self._version(conn, doc["pk"], doc["id"]) is not None
                raise ConflictError(f"{doc['id']!r} " + ("changed since it was read" if exists else "does not exist"))
            index_search(conn, doc)
        return str(version)

    def upsert(self, doc: Doc) -> str:
        body, kind, at = prepare(doc, self.max_doc_bytes)
        with self._write() as conn:
            version = allocate(conn)
            conn.execute(UPSERT, (doc["pk"], doc["id"], body, version, kind, at))
            index_search(conn, doc)
        return str(version)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        expected = _parse_etag(if_match)
        with self._write() as conn:
            current = self._version(conn, pk, doc_id)
            if current is None:
                return False
            if expected is not None and current != expected:
                raise ConflictError(f"{doc_id!r} changed since it was read")
            conn.execute("DELETE FROM docs WHERE pk = ? AND id = ?", (pk, doc_id))
            if doc_id == "exec":
                conn.execute("DELETE FROM search_idx WHERE pk = ?", (pk,))
        return True

    @staticmethod
    def _version(conn: sqlite3.Connection, pk: str, doc_id: str) -> int | None:
        row = conn.execute("SELECT version FROM docs WHERE pk = ? AND id = ?", (pk, doc_id)).fetchone()
        return None if row is None else int(row[0])

    # partition operations ------------------------------------------------------------------

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        try:
            after = int(since or 0)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"not a cursor of this store: {since!r}") from exc
        with self._conn() as conn:
            # The cursor first, then the documents, each in its own autocommit snapshot: writers
            # commit in version order (BEGIN IMMEDIATE), so every document at or below the cursor
            # is seen now, and one newer than it is read again next time (merged by id).
            (cursor,) = conn.execute("SELECT seq FROM meta WHERE k = 0").fetchone()
            if after:  # what changed since: docs_changes reads only that, not the whole partition
                rows = conn.execute(
                    "SELECT id, body, version FROM docs INDEXED BY docs_changes WHERE pk = ? AND version > ?"
                    " ORDER BY id",
                    (pk, after),
                ).fetchall()
            else:  # all of it, in id order from the primary key
                rows = conn.execute("SELECT id, body, version FROM docs WHERE pk = ? ORDER BY id", (pk,)).fetchall()
        return PartitionRead(docs=[_decode(body, pk, doc_id, version) for doc_id, body, version in rows], cursor=cursor)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        prepared = self._prepare_batch(pk, ops)
        if not ops:
            return []
        with self._write() as conn:
            return apply_ops(conn, pk, ops, prepared)

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        self._check_rewrites(pk, ops, also)
        prepared = self._prepare_batch(pk, ops)
        with self._write() as conn:  # BEGIN IMMEDIATE: the rewrites read the latest commit
            out = apply_ops(conn, pk, ops, prepared) if ops else []
            etags = apply_rewrites(conn, also, self.max_doc_bytes)
        for rewrite, etag in zip(also, etags, strict=True):
            rewrite.etag = etag
        return out

    def _prepare_batch(self, pk: str, ops: Sequence[Op]) -> list[Prepared | None]:
        self._check_batch(pk, ops, check_docs=False)  # prepare checks each document
        prepared = [prepare(op.doc, self.max_doc_bytes) if op.doc is not None else None for op in ops]
        self._check_batch_bytes(pk, ops, [sent_size(p[0]) if p is not None else 0 for p in prepared])
        return prepared

    # scans ------------------------------------------------------------------------------------

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT pk, id, due_at FROM docs INDEXED BY docs_due"
                " WHERE due_kind = ? AND due_kind IS NOT NULL AND due_at <= ?"
                " ORDER BY due_at, pk, id LIMIT ?",
                (kind, float(now), int(limit)),
            ).fetchall()
        return [DueRef(pk, doc_id, float(at)) for pk, doc_id, at in rows]

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        upper = _prefix_upper(pk_prefix)
        sql = "SELECT pk FROM docs WHERE id = 'exec' AND pk >= ?"
        params: list[Any] = [pk_prefix]
        if upper is not None:
            sql += " AND pk < ?"
            params.append(upper)
        sql += " AND substr(pk, 1, ?) = ? ORDER BY pk LIMIT ?"
        params += [len(pk_prefix), pk_prefix, int(limit)]
        with self._conn() as conn:
            return [str(pk) for (pk,) in conn.execute(sql, params)]

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        check_page_size(limit)
        flt = flt or ExecFilter()
        if flt.search:
            return self._list_by_search(flt, limit, cursor)
        sql = f"SELECT pk, body, version, {_CREATED} FROM docs INDEXED BY docs_execs WHERE id = 'exec'"
        params: list[Any] = []
        for field_name, value in (("workflow", flt.workflow), ("status", flt.status)):
            if value is not None:
                sql += f" AND (CASE WHEN json_valid(body) THEN json_extract(body, '$.{field_name}') END) = ?"
                params.append(value)
        if flt.created_after is not None:
            sql += f" AND {_CREATED} >= ?"
            params.append(float(flt.created_after))
        if flt.created_before is not None:
            sql += f" AND {_CREATED} < ?"
            params.append(float(flt.created_before))
        if cursor is not None:
            sql += f" AND ({_CREATED}, pk) < (?, ?)"
            params += list(decode_keyset(cursor))
        sql += f" ORDER BY {_CREATED} DESC, pk DESC LIMIT ?"
        params.append(limit + 1)
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return exec_page(rows, limit)

    def _list_by_search(self, flt: ExecFilter, limit: int, cursor: str | None) -> ExecPage:
        sql, params = search_query(flt, limit, cursor)
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return exec_page(rows, limit)


def from_url(url: str, **options: Any) -> SqliteStore:
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

    Options (keyword or URL query): ``busy_timeout`` — seconds to wait for another writer's lock
    (default 5); ``file_mode`` — permissions of a file the store creates, octal (default ``0600``;
    SQLite gives the ``-wal``/``-shm`` files the same). Example:
    ``sqlite:////var/lib/app/durable.db?busy_timeout=10&file_mode=0640``.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise ConfigurationError(f"not a sqlite URL: {redact_url(url)!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URL {redact_url(url)!r} has a host; use sqlite:///relative or sqlite:////absolute"
        )
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    settings: dict[str, Any] = dict(parse_qsl(parts.query))
    settings.update(options)
    unknown = set(settings) - {"busy_timeout", "file_mode"}
    if unknown:
        raise ConfigurationError(f"unknown sqlite store option(s): {', '.join(sorted(unknown))}")
    try:
        busy_timeout = float(settings.get("busy_timeout", DEFAULT_BUSY_TIMEOUT))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"busy_timeout must be a number of seconds: {exc}") from exc
    return SqliteStore(path, busy_timeout=busy_timeout, file_mode=settings.get("file_mode", DEFAULT_FILE_MODE))
