"""Pushed results on PostgreSQL: ``LISTEN``/``NOTIFY`` (:mod:`.base`, :mod:`celery_durable.stores.postgres.store`).

The store sends ``NOTIFY`` itself, as a statement of the very transaction that writes an exec
document with a notifying status (``pg_notify(channel, id)``; in a batch it is pipelined before
``COMMIT``, so it costs no round trip, and a single write becomes one statement with a CTE).
PostgreSQL delivers notifications only at commit and drops those of a rolled back transaction:
a notification never precedes the data, and a failed write sends none. ``publish`` is therefore
a no-op.

The channel is one per table: ``celery_durable_`` + 16 hex digits of a digest of
``schema.table`` (an identifier well under PostgreSQL's 63 bytes); the payload is the execution
id (:func:`.push.payload_of`: a digest for an id beyond 1,000 bytes, under the 8,000-byte limit).

Each process that waits holds one extra connection, outside the pool, in ``LISTEN`` (psycopg 3's
``Connection.notifies(timeout=)``), shared by all its waiters. If it is killed or the server
goes away the waiters are woken and poll; the listener reconnects with a backoff.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import psycopg

from celery_durable.stores.postgres.connection import PgConfig
from celery_durable.stores.push.base import Hub

__all__ = ["PgNotifier", "channel_of"]


def channel_of(cfg: PgConfig) -> str:
    digest = hashlib.sha256(f"{cfg.schema or ''}.{cfg.table}".encode()).hexdigest()[:16]
    return f"celery_durable_{digest}"


class PgNotifier(Hub):
    name = "postgres"

    def __init__(self, cfg: PgConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.channel = channel_of(cfg)
        #: the listening connection (tests find its backend pid here)
        self.conn: psycopg.Connection[Any] | None = None

    def __repr__(self) -> str:
        return f"PgNotifier({self.cfg.display!r}, channel={self.channel!r})"

    def publish(self, execution_id: str) -> None:
        pass  # the store's commit sent it (module docstring)

    def listen(self, ready: Callable[[], None], deliver: Callable[[str], None], stopped: Callable[[], bool]) -> None:
        try:  # a server message may echo the password (a database of that name): scrubbed
            conn = psycopg.connect(
                self.cfg.conninfo,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self.cfg.connect_timeout)),
                application_name="celery_durable listen",
            )
        except psycopg.Error as exc:
            raise ConnectionError(self.cfg.scrub(str(exc)).strip()[:300]) from None
        self.conn = conn
        try:
            conn.execute(f'LISTEN "{self.channel}"')  # synchronous: listening once it returns
            ready()
            while not stopped():
                for note in conn.notifies(timeout=1.0):
                    deliver(note.payload)
        except psycopg.Error as exc:
            raise ConnectionError(self.cfg.scrub(str(exc)).strip()[:300]) from None
        finally:
            self.conn = None
            try:
                conn.close()
            except psycopg.Error:
                pass
