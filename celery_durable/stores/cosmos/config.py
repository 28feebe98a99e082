"""URL parsing and secret handling of the Cosmos store (see :mod:`celery_durable.stores.cosmos.store`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

from celery_durable.errors import ConfigurationError

__all__ = ["Secret", "parse_url", "server_message", "KEY_ENV", "CallDeadline", "DeadlineExceeded", "end_sdk_threads"]

#: Environment variable holding the account key.
KEY_ENV = "DURABLE_COSMOS_KEY"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# the signature part of a Cosmos authorization token, should one ever end up in a message
_SIG = re.compile(r"(sig(?:=|%3d|%3D))[^&\s'\"]+")


class Secret:
    """Holds the account key: its repr never shows it, :meth:`scrub` removes it from text."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        for form in {self._value, quote(self._value, safe=""), quote_plus(self._value)}:
            text = text.replace(form, "***")
        return _SIG.sub(r"\1***", text)

    def __repr__(self) -> str:
        return "<secret>"


def server_message(exc: Exception) -> str:
    """The service's own message from an SDK error (its body is usually ``{"code", "message"}``)."""
    raw = getattr(exc, "http_error_message", None) or ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("message") or text)
    return _SIG.sub(r"\1***", " ".join(text.split()))


def _flag(name: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise ValueError(f"{name} is not a boolean")

    return convert


_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "verify": _flag("verify"),
    "create": _flag("create"),
    "discovery": _flag("discovery"),
    "consistency": str,
    "timeout": float,
    "retries": int,
    "throttle_retries": int,
    "throttle_max_wait": int,
    "due_bucket": float,
    "due_shards": int,
    "read_timeout": float,
    "deadline": float,
    "throughput": int,
    "autoscale_max": int,
    "credential": lambda v: v,
}


def parse_url(url: str, options: dict[str, Any]) -> tuple[str, str, str, str | None, dict[str, Any]]:
    """``(endpoint, database, container, key, keyword options)`` from a ``cosmos://`` URL.

    Keyword ``options`` override URL parameters. The key: ``key=`` option, else ``$DURABLE_COSMOS_KEY``,
    else ``key=`` in the URL. Error messages never quote the URL (it may hold the key).
    """
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError as exc:
        raise ConfigurationError("cosmos store URL has an invalid port") from exc
    if parts.scheme.lower() not in ("cosmos", "cosmoss") or not parts.hostname:
        raise ConfigurationError("cosmos store URL must look like cosmos://host[:port]/?database=DB&container=C")
    params: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    segments = [s for s in parts.path.split("/") if s]
    for name, value in zip(("database", "container"), segments, strict=False):
        params.setdefault(name, value)
    url_key = params.pop("key", None)
    if url_key is not None:
        url_key = url_key.replace(" ", "+")  # an unencoded base64 "+" arrives as a space
    params.update(options)
    key = params.pop("key", None) or os.environ.get(KEY_ENV) or url_key
    database, container = params.pop("database", None), params.pop("container", None)
    if not database or not container:
        raise ConfigurationError("cosmos store URL needs database= and container=")
    kwargs: dict[str, Any] = {}
    for name, value in params.items():
        if name not in _OPTIONS:
            raise ConfigurationError(f"unknown cosmos store option {name!r}")
        try:
            kwargs[name] = _OPTIONS[name](value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"cosmos store option {name}={value!r} is invalid") from exc
    return f"https://{parts.hostname}{port}/", str(database), str(container), key, kwargs


class DeadlineExceeded(Exception):
    """A store call ran out of its deadline (raised by :meth:`CallDeadline.hook` before a request)."""


class CallDeadline:
    """The absolute deadline of the store call running in this thread.

    The SDK's own timeouts are per HTTP attempt (and it retries), so one call could outlive an
    activity's lease. The store opens a deadline around each call (:meth:`running`; a nested call
    keeps the outer one) and the SDK calls :meth:`hook` (its ``raw_request_hook``) before every
    attempt, its own retries included: the attempt's connect and read timeouts are cut to what is
    left, and no attempt starts once nothing is.
    """

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ConfigurationError(f"cosmos deadline must be a positive number of seconds, got {seconds!r}")
        self.seconds = seconds
        self._local = threading.local()

    def left(self) -> float | None:
        """Seconds left for the call in progress (``None`` outside a call: SDK background threads)."""
        end: float | None = getattr(self._local, "end", None)
        return None if end is None else end - time.monotonic()

    @contextlib.contextmanager
    def running(self, seconds: float | None = None) -> Iterator[None]:
        if getattr(self._local, "end", None) is not None:
            yield
            return
        self._local.end = time.monotonic() + (self.seconds if seconds is None else seconds)
        try:
            yield
        finally:
            self._local.end = None

    def hook(self, request: Any) -> None:
        left = self.left()
        if left is None:
            return
        if left <= 0.01:
            raise DeadlineExceeded("the call's deadline passed before this request")
        opts = request.context.options
        for name in ("connection_timeout", "read_timeout"):
            current = opts.get(name)
            opts[name] = left if not isinstance(current, int | float) else min(float(current), left)


def end_sdk_threads(client: Any, timeout: float) -> None:
    """Wait (up to ``timeout``) for the SDK's background endpoint refresh of ``client`` and end its
    thread pool, before the client is closed (its ``close()`` leaves both running).

    Why: a worker's main process opens the store to check it, closes it and then forks its pool.
    A child forked while such a thread was inside OpenSSL (the health check's TLS handshake)
    inherits OpenSSL's locks held by a thread it does not have, and its first TLS connection hangs
    for ever (seen in ``SSL_CTX_new``): a pool child that takes messages and never runs them.
    Private SDK attributes, read defensively: a future SDK without them is simply not waited for.
    """
    manager = getattr(getattr(client, "client_connection", None), "_global_endpoint_manager", None)
    thread = getattr(manager, "_refresh_thread", None)
    if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
        thread.join(timeout)  # it waits for the health checks it submitted to the pool
    executor = getattr(manager, "executor", None)
    alive = isinstance(thread, threading.Thread) and thread.is_alive()
    with contextlib.suppress(Exception):
        executor.shutdown(wait=not alive, cancel_futures=True)  # type: ignore[union-attr]


# The SDK logs every request and response at INFO (with the key redacted): far too chatty for a
# worker at ``--loglevel=INFO`` (~30 lines a request; in the chaos run it cost enough CPU to push
# queue waits past the activity queue timeout). azure-cosmos logs through its own policy's logger,
# azure-core through its own. Quiet unless the application chose a level for them.
for _name in ("azure.core.pipeline.policies.http_logging_policy", "azure.cosmos._cosmos_http_logging_policy"):
    _http_log = logging.getLogger(_name)
    if _http_log.level == logging.NOTSET:
        _http_log.setLevel(logging.WARNING)
