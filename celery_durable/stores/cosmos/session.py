"""Session tokens of the Cosmos store (issue 16): read-your-writes across processes.

Under *Session* consistency a read is only guaranteed to see a write when it carries a session
token at least as new as that write's. The SDK tracks tokens for its own client, but a message
that follows a write is handled by another process. So the store remembers, per partition key,
the newest token it has seen (the tokens of its own writes and those handed to it with
:meth:`use_session_token`) and sends it with every read of that partition.

A token is ``"<range id>:<vector token>"`` (several joined by ``,``; the vector token is
``version#globalLSN[#region=LSN...]``). Tokens of one range are merged by keeping the newer
(the SDK's own ``VectorSessionToken.merge``; by global LSN when that refuses), so passing an old
token never makes a read staler than one the store would send anyway.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SessionTokens", "CosmosSessions", "merge_tokens", "SESSION_HEADER"]

#: response header carrying the session token (and the request header a read sends it in)
SESSION_HEADER = "x-ms-session-token"
#: the sub-status of a 404 whose replica lacks the session: it answers no token worth keeping
READ_SESSION_NOT_AVAILABLE = 1002
#: partitions whose token a store remembers (least recently used are forgotten: a read of a
#: forgotten partition falls back to the SDK's own session handling)
MAX_PARTITIONS = 10_000
#: longest token accepted from a message (a real one is well under 100 bytes per range)
MAX_TOKEN_LENGTH = 4096


def _lsn(vector: str) -> int:
    """The global LSN of a vector token (``version#globalLSN#...``); -1 when unparsable."""
    parts = vector.split("#")
    try:
        return int(parts[1]) if len(parts) > 1 else int(parts[0])
    except ValueError:
        return -1


def _merge_vector(a: str, b: str) -> str:
    from azure.cosmos._vector_session_token import VectorSessionToken as _Vector  # private: the SDK's own rules

    VectorSessionToken: Any = _Vector

    with contextlib.suppress(Exception):
        va, vb = VectorSessionToken.create(a), VectorSessionToken.create(b)
        if va is not None and vb is not None:
            return str(va.merge(vb).convert_to_string())
    return a if _lsn(a) >= _lsn(b) else b


def _parse(token: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in token.split(","):
        rid, sep, vector = pair.strip().partition(":")
        if sep and rid and vector:
            out[rid] = _merge_vector(out[rid], vector) if rid in out else vector
    return out


def merge_tokens(a: str | None, b: str | None) -> str | None:
    """The newer of two session tokens, range by range (``None`` when neither says anything)."""
    if not a or not b:
        return a or b or None
    ranges = _parse(a)
    for rid, vector in _parse(b).items():
        ranges[rid] = _merge_vector(ranges[rid], vector) if rid in ranges else vector
    return ",".join(f"{rid}:{vector}" for rid, vector in ranges.items()) or None


class SessionTokens:
    """Thread-safe, bounded map partition key -> newest session token seen."""

    def __init__(self, max_partitions: int = MAX_PARTITIONS) -> None:
        self._lock = threading.Lock()
        self._tokens: OrderedDict[str, str] = OrderedDict()
        self._max = max_partitions

    def after_fork(self) -> None:
        """In a forked child: a new lock (a thread of the parent may have held this one mid-fork,
        and it does not exist here to release it); the tokens stay valid."""
        self._lock = threading.Lock()

    def get(self, pk: str) -> str | None:
        with self._lock:
            return self._tokens.get(pk)

    def merge(self, pk: str, token: str | None) -> None:
        if not token:
            return
        with self._lock:
            merged = merge_tokens(self._tokens.get(pk), token)
            if merged is None:
                return
            self._tokens[pk] = merged
            self._tokens.move_to_end(pk)
            while len(self._tokens) > self._max:
                self._tokens.popitem(last=False)

    def hook(self, pk: str) -> Callable[[Mapping[str, Any], Any], None]:
        """An SDK ``response_hook`` recording the token of the response (thread-safe, unlike the
        client's shared ``last_response_headers``)."""

        def record(headers: Mapping[str, Any], _result: Any) -> None:
            with contextlib.suppress(Exception):  # bookkeeping must never fail a store call
                self.merge(pk, headers.get(SESSION_HEADER))

        return record


class CosmosSessions:
    """The store's side of the token API (:meth:`Store.session_token`), a mixin of ``CosmosStore``."""

    _sessions: SessionTokens

    def session_token(self, pk: str) -> str | None:
        return self._sessions.get(pk)

    def use_session_token(self, pk: str, token: str | None) -> None:
        if isinstance(token, str) and 0 < len(token) <= MAX_TOKEN_LENGTH:
            self._sessions.merge(pk, token)

    def _session_read(self, pk: str | None) -> dict[str, Any]:
        """Keyword options of a read of partition ``pk``: our newest token for it (if any) and a
        hook keeping the response's (monotonic reads)."""
        if pk is None:
            return {}
        token = self._sessions.get(pk)
        options: dict[str, Any] = {"response_hook": self._sessions.hook(pk)}
        if token:
            options["session_token"] = token
        return options

    def _session_write(self, pk: str) -> dict[str, Any]:
        """Keyword options of a write to partition ``pk``: a hook keeping the write's token."""
        return {"response_hook": self._sessions.hook(pk)}

    def _session_lost(self, pk: str, exc: BaseException) -> None:
        """A write to ``pk`` that lost (409, 412; 404: the document went) answers the session
        token of what it lost against (Cosmos sends it; Microsoft's SDKs keep it too): the next
        read of ``pk`` then sees at least that, not the stale version the write was based on for
        as long as the replica lags (a response hook sees successes only). Not a 404.1002 (the
        replica has not the session yet), as the .NET SDK's GatewayStoreModel."""
        if getattr(exc, "sub_status", None) == READ_SESSION_NOT_AVAILABLE:
            return
        with contextlib.suppress(Exception):  # bookkeeping must never fail a store call
            self._sessions.merge(pk, (getattr(exc, "headers", None) or {}).get(SESSION_HEADER))
