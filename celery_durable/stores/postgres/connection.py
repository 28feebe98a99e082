"""The PostgreSQL store's URL, connection pool and error translation (:mod:`celery_durable.stores.postgres.store`).

Why a small pool of our own rather than ``psycopg_pool.ConnectionPool``: that pool connects in
background threads with an exponential backoff (1, 2, 4 … s) after a failure, so once the server
is back the first calls still wait out the backoff, and while it is down a caller gets an opaque
``PoolTimeout`` after the whole timeout instead of the server's reason; its threads are also gone
in a ``fork()`` child. This pool connects in the calling thread (a refused connection is reported
at once, with libpq's reason, and the next call after an outage connects again), keeps idle
connections for reuse, caps the connections in use at ``pool_max`` and is dropped after fork
without touching the inherited sockets.
"""

from __future__ import annotations

import logging
import math
import os
import re
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pge
from psycopg.conninfo import conninfo_to_dict

from celery_durable.errors import ConfigurationError, ConflictError, StoreError, StoreUnavailable
from celery_durable.settings import redact_url, url_password_is_raw

__all__ = ["PgConfig", "Pool", "parse_url", "translate", "DEFAULT_TABLE", "AbortedPipelineNoise"]


class AbortedPipelineNoise(logging.Filter):
    """Drops psycopg's warning that a pipeline could not terminate because it was aborted.

    A batch is one pipeline; a write in it that conflicts aborts it, and psycopg, leaving the
    pipeline with that error already raised, warns ``error ignored terminating …: pipeline
    aborted`` about the follow-up. The error itself is the news (mapped to ConflictError and
    handled: a drive reads again), so under contention a worker's log filled with one WARNING per
    conflict (bench/limits.py on PostgreSQL: 1,373 in a minute). Any other termination error
    still logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        aborted = len(args) == 2 and isinstance(args[1], pge.PipelineAborted)
        return not (aborted and record.msg == "error ignored terminating %r: %s")


_PSYCOPG_LOG = logging.getLogger("psycopg")
if not any(isinstance(f, AbortedPipelineNoise) for f in _PSYCOPG_LOG.filters):
    _PSYCOPG_LOG.addFilter(AbortedPipelineNoise())

DEFAULT_TABLE = "durable_docs"
DEFAULT_POOL_MAX = 10
DEFAULT_CONNECT_TIMEOUT = 10.0
#: options the store reads from the URL query (or keywords); every other query parameter is libpq's
OPTIONS = ("table", "schema", "pool_max", "connect_timeout")
#: a plain SQL identifier (quoted as is, so case is kept); short enough for "<table>_execs" (63 max)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,49}")


@dataclass(frozen=True)
class PgConfig:
    conninfo: str  # the URL without our options, as libpq reads it
    display: str  # the URL with the password replaced (for messages and repr)
    password: str | None
    table: str
    schema: str | None
    pool_max: int
    connect_timeout: float
    #: the URL's password holds a raw '#', '?', '/' or '@': libpq cuts it there and quotes the rest
    #: as a host, a port or a parameter, so none of its messages may be shown
    raw_password: bool = False

    def scrub(self, text: str) -> str:
        """``text`` with the password (should a server or libpq message echo it) hidden."""
        if self.raw_password:
            return "(libpq's message is not shown: a '#', '?', '/', '@' or '%' in the password must be percent-encoded)"
        return text.replace(self.password, "***") if self.password else text


def _ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ConfigurationError(
            f"postgresql store {what} must be letters, digits and '_' (at most 50, not starting with a digit),"
            f" got {name!r}"
        )
    return name


def parse_url(url: str, options: dict[str, Any]) -> PgConfig:
    """``postgresql://user:password@host:port/db?table=...&schema=...`` (or ``postgres://``)."""
    display = redact_url(url)
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a postgresql URL: {display!r}")
    ours: dict[str, Any] = {}
    libpq: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        (ours.__setitem__(key, value) if key in OPTIONS else libpq.append((key, value)))
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown postgresql store option(s): {', '.join(sorted(unknown))} (known: {', '.join(OPTIONS)};"
            " libpq parameters go in the URL query)"
        )
    ours.update(options)
    try:
        pool_max = int(ours.get("pool_max", DEFAULT_POOL_MAX))
        timeout = float(ours.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"postgresql store: pool_max and connect_timeout must be numbers: {exc}") from exc
    if pool_max < 1:
        raise ConfigurationError(f"postgresql store: pool_max must be >= 1, got {pool_max}")
    if not 0 < timeout < math.inf:
        raise ConfigurationError(f"postgresql store: connect_timeout must be > 0 seconds, got {timeout}")
    schema = ours.get("schema")
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(libpq), ""))
    if not parts.netloc:  # postgresql:///db (socket, or host= in the query): urlunsplit drops the "//"
        conninfo = conninfo.replace(":", "://", 1)
    try:  # libpq's own parser: a malformed URL or an unknown parameter fails here, not at first use
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        # libpq quotes the part it cannot parse, which for a raw '?' is the password's tail
        if url_password_is_raw(url):
            raise ConfigurationError(
                f"invalid postgresql URL {display!r}: a '#', '?', '/', '@' or '%' in the password must be"
                " percent-encoded"
            ) from None
        raise ConfigurationError(f"invalid postgresql URL {display!r}: {exc}") from exc
    password = params.get("password")
    return PgConfig(
        conninfo=conninfo,
        display=display,
        password=str(password) if password else None,
        table=_ident(ours.get("table", DEFAULT_TABLE), "table"),
        schema=None if schema in (None, "") else _ident(schema, "schema"),
        pool_max=pool_max,
        connect_timeout=timeout,
        raw_password=url_password_is_raw(url),
    )


def translate(exc: BaseException, cfg: PgConfig, what: str) -> Exception:
    """The library error for a psycopg exception (the boundary; never showing the password)."""
    msg = f"postgresql store {cfg.display} {what}: {type(exc).__name__}: {cfg.scrub(str(exc)).strip()[:300]}"
    if isinstance(exc, pge.UniqueViolation | pge.TransactionRollback | pge.SerializationFailure | pge.DeadlockDetected):
        # an id taken by a concurrent writer, a deadlock or serialization victim: nothing applied
        return ConflictError(msg)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.InternalError):
        return StoreUnavailable(msg)
    if isinstance(exc, psycopg.DataError | pge.InsufficientPrivilege):
        return ConfigurationError(msg)  # e.g. a NUL character in an id, or no right to the table
    return StoreError(msg)


def _healthy(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle pooled connection is still usable, without a round trip when it is.

    An idle connection's socket has nothing to read unless the server closed it (restart,
    ``pg_terminate_backend``, idle timeout) or sent a notice: only then ask the server.
    """
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        if not poller.poll(0):
            return True
        conn.execute("SELECT 1")
        return True
    except (psycopg.Error, OSError, ValueError):
        return False


class Pool:
    """Connections of one process: reused LIFO, at most ``pool_max`` in use, dropped after fork."""

    def __init__(self, cfg: PgConfig) -> None:
        self.cfg = cfg
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            # libpq takes whole seconds and treats less than 2 as 2
            "connect_timeout": max(2, math.ceil(cfg.connect_timeout)),
        }
        if "application_name" not in conninfo_to_dict(cfg.conninfo):
            self._connect_kwargs["application_name"] = "celery_durable"
        self._reset()
        # connections inherited across fork(): kept referenced so they are never finalised here
        self._abandoned: list[psycopg.Connection[Any]] = []

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.cfg.pool_max)
        self._idle: list[psycopg.Connection[Any]] = []
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        # The parent's sockets are shared with it: closing them here would end its sessions
        # (libpq sends Terminate). Forget them; psycopg's finaliser skips a foreign process's.
        self._abandoned.extend(self._idle)
        self._reset()

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.cfg.conninfo, **self._connect_kwargs)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for the block; psycopg errors leave as library errors."""
        if os.getpid() != self._pid:
            self._after_fork()
        slots, pid = self._slots, self._pid
        if not slots.acquire(timeout=self.cfg.connect_timeout):
            raise StoreUnavailable(
                f"postgresql store {self.cfg.display}: all {self.cfg.pool_max} connections stayed busy"
                f" for {self.cfg.connect_timeout:g} s (raise pool_max?)"
            )
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._checkout()
            yield conn
        except psycopg.Error as exc:
            raise translate(exc, self.cfg, "failed") from exc
        except UnicodeEncodeError as exc:  # psycopg's adapter, before anything is sent
            raise ConfigurationError(
                f"postgresql store {self.cfg.display}: an id or value holds a lone surrogate"
                f" ({exc.object[exc.start : exc.end]!r}), which PostgreSQL text cannot store"
            ) from exc
        finally:
            if conn is not None:
                self._checkin(conn, pid)
            slots.release()

    def _checkout(self) -> psycopg.Connection[Any]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                started = time.monotonic()
                try:
                    return self.connect()
                except psycopg.Error as exc:
                    took = time.monotonic() - started
                    raise StoreUnavailable(
                        f"postgresql store {self.cfg.display}: cannot connect ({took:.1f} s):"
                        f" {self.cfg.scrub(str(exc)).strip()[:300]}"
                    ) from (None if self.cfg.raw_password else exc)
            if _healthy(conn):
                return conn
            self._discard(conn)

    def _checkin(self, conn: psycopg.Connection[Any], pid: int) -> None:
        if pid != os.getpid():
            return  # forked while in use: the parent's socket, never ours to close
        if conn.broken or conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # broken, or an error left it mid-transaction: a fresh one is cheaper than doubt
            self._discard(conn)
            return
        with self._lock:
            if pid == self._pid:
                self._idle.append(conn)
                return
        self._discard(conn)

    @staticmethod
    def _discard(conn: psycopg.Connection[Any]) -> None:
        try:
            conn.close()
        except psycopg.Error:
            pass

    def clear(self) -> None:
        """Close the idle connections of this process (after fork: forget the parent's)."""
        if os.getpid() != self._pid:
            self._after_fork()
            return
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)
