"""PostgreSQL for the tests: the server at ``$TEST_POSTGRES_URL`` (default 127.0.0.1:5432, db ``test``).

``postgres_url``: a ``postgresql://`` store URL of a fresh, uniquely named schema (dropped after
the test), so every test starts empty. ``postgres_proxy``: a TCP proxy in front of the server
that a test can pause (the listener closes and open connections are cut) to cause an outage.
If the server is unreachable the tests that need it are skipped with the reason, except in CI
(``CI=true``), where they fail: a green CI run must mean PostgreSQL ran.

Imported by tests/stores/conftest.py and tests/integration/conftest.py.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

BASE_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: short: the outage test waits for connection attempts (libpq's minimum is 2 s)
QUERY = "connect_timeout=2"

T = TypeVar("T")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"PostgreSQL unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


@pytest.fixture(scope="session")
def _postgres_server() -> str | None:
    """``None`` if the server answers, else why not (probed once per session)."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc}); pip install -e '.[dev]'"
    try:
        psycopg.connect(BASE_URL, connect_timeout=5).close()
    except psycopg.Error as exc:
        return f"{BASE_URL}: {exc}"
    return None


def _drop_schema(schema: str) -> None:
    import psycopg

    try:
        with psycopg.connect(BASE_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.Error:
        pass  # a leftover schema is harmless: every test uses a new name


@pytest.fixture
def postgres_schema(_postgres_server: str | None) -> Iterator[str]:
    """A fresh schema name (the store creates it on first use); dropped after the test."""
    if _postgres_server is not None:
        _unavailable(_postgres_server)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield schema
    _drop_schema(schema)


def _url(base: str, schema: str, netloc: str | None = None) -> str:
    parts = urlsplit(base)
    query = "&".join(q for q in (parts.query, f"schema={schema}", QUERY) if q)
    return urlunsplit((parts.scheme, netloc or parts.netloc, parts.path, query, ""))


@pytest.fixture
def postgres_url(postgres_schema: str) -> str:
    """A store URL of a fresh, empty schema."""
    return _url(BASE_URL, postgres_schema)


class Proxy:
    """A TCP forwarder to the PostgreSQL server; :meth:`pause` makes it refuse and cut connections."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.resume()

    def resume(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def pause(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    close = pause

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # paused
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def postgres_proxy(_postgres_server: str | None) -> Iterator[Proxy]:
    if _postgres_server is not None:
        _unavailable(_postgres_server)
    parts = urlsplit(BASE_URL)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    yield proxy
    proxy.close()


@pytest.fixture
def postgres_proxied_url(postgres_schema: str, postgres_proxy: Proxy) -> str:
    """A store URL of a fresh schema, reached through ``postgres_proxy``."""
    parts = urlsplit(BASE_URL)
    netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return _url(BASE_URL, postgres_schema, f"{netloc}127.0.0.1:{postgres_proxy.port}")


def round_trips(store: Any, call: Callable[[], T], tmp_path: Path) -> tuple[T, int]:
    """Run ``call`` on a PostgreSQL store; its result and how many round trips it cost.

    libpq's protocol trace of every new connection is read: a round trip is the client sending
    (``F`` lines) then reading the server's answer (``B`` lines); pipelined messages sent before
    the client waits count once.
    """
    from psycopg import pq

    trace = tmp_path / "pq.trace"
    store.reopen()  # drop pooled connections: the next one is traced
    pool = store._pool
    connect = pool.connect
    with open(trace, "w") as out:

        def traced() -> Any:
            conn = connect()
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            return conn

        pool.connect = traced
        try:
            result = call()
        finally:
            pool.connect = connect
            store.reopen()
    sides = [line.split("\t", 1)[0] for line in trace.read_text().splitlines()]
    return result, sum(1 for a, b in zip(sides, sides[1:], strict=False) if (a, b) == ("F", "B"))
