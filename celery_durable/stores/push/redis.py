"""Pushed results over Redis pub/sub (:mod:`.base`): the transport when the Celery broker or
result backend is Redis and the store has no notifications of its own.

One channel, ``celery_durable:done``, carries the ids of executions that ended (published by
the worker after the commit). Every process with waiters subscribes to it once, on a connection
of its own, so a waiter is subscribed before its first read with no round trip of its own. Pub/sub
does not depend on the database number of the URL. A publish that fails (Redis down) is logged
and skipped for a few seconds: the drive that ended the execution never waits on it for long,
and waiters find the result on their next re-read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from celery_durable.settings import redact_url, url_password_is_raw
from celery_durable.stores.push.base import Hub, payload_of

__all__ = ["RedisNotifier", "CHANNEL"]

log = logging.getLogger("celery_durable.push")

CHANNEL = "celery_durable:done"
#: seconds a publisher skips publishing after a failure
_PAUSE_AFTER_FAILURE = 5.0
_TIMEOUT = 1.0


class RedisNotifier(Hub):
    name = "redis"

    def __init__(self, url: str, channel: str = CHANNEL) -> None:
        super().__init__()
        self.url = url
        self.channel = channel
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._paused_until = 0.0

    def __repr__(self) -> str:
        return f"RedisNotifier({redact_url(self.url)!r})"

    def scrub(self, text: str) -> str:
        # redis-py cuts a password at a raw '#', '?', '/' or '@' and quotes the rest as a port or host
        if url_password_is_raw(self.url):
            return "(not shown: a '#', '?', '/' or '@' in the push URL's password must be percent-encoded)"
        try:
            password = urlsplit(self.url).password
        except ValueError:  # e.g. a '[' in it reads as a bad IPv6 host: show nothing of the message
            return "(not shown: the push URL does not parse; its password must be percent-encoded)"
        return text.replace(password, "***") if password else text

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_connect_timeout=_TIMEOUT, socket_timeout=_TIMEOUT)

    def publish(self, execution_id: str) -> None:
        if time.monotonic() < self._paused_until:
            return
        try:
            with self._client_lock:
                if self._client is None:
                    self._client = self._redis()
                client = self._client
            client.publish(self.channel, payload_of(execution_id))  # redis-py reconnects after fork
        except Exception as exc:  # noqa: BLE001 - a hint only: waiters re-read the store anyway
            self._paused_until = time.monotonic() + _PAUSE_AFTER_FAILURE
            log.warning("result push: publishing to %s failed (paused %gs): %s", redact_url(self.url),
                        _PAUSE_AFTER_FAILURE, self.scrub(str(exc)))  # fmt: skip

    def listen(self, ready: Callable[[], None], deliver: Callable[[str], None], stopped: Callable[[], bool]) -> None:
        import redis

        # no socket timeout while listening: get_message(timeout=) bounds each wait itself
        client = redis.Redis.from_url(self.url, socket_connect_timeout=_TIMEOUT, socket_timeout=None)
        pubsub = client.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            deadline = time.monotonic() + 5
            while True:  # the server's confirmation: from here on every publish reaches us
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "subscribe":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no confirmation of SUBSCRIBE {self.channel}")
            ready()
            while not stopped():
                message = pubsub.get_message(timeout=1.0)
                kind = None if message is None else message.get("type")
                if kind == "message":
                    data = message.get("data")  # type: ignore[union-attr]
                    deliver(data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else str(data))
                elif kind == "subscribe":
                    # redis-py reconnected and subscribed again: what was published in between
                    # is lost, so every waiter re-reads the store
                    self.resync()
        finally:
            try:
                pubsub.close()
                client.close()
            except redis.RedisError:
                pass

    def close(self) -> None:
        super().close()
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
