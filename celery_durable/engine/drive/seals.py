"""Seals: what a message may carry only if the library itself wrote it (issue 23, item 5).

Whoever can publish to the broker can send any header. No header value is ever recorded as it
stands: a step's result comes from running its activity, or — for the store-outage hand-off,
where the attempt ran but its outcome could not be recorded — from a value this library sealed
(HMAC-SHA256). A lease takeover (a retry naming the attempt it succeeds, ``h``) and an effect's
adopt header need a seal too: otherwise a message naming the current holder takes a live
attempt's lease.

The key is a random secret stored once in the store (first writer wins), so every process that
shares the store shares it; each process reads it once and caches it. It is never logged,
shown or put in a message. Whoever can read the store can forge seals: the store is trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

from celery_durable.errors import CorruptDocument, StoreError
from celery_durable.stores.base import Doc, Store

__all__ = [
    "KEY_PK",
    "KEY_ID",
    "seal",
    "verify",
    "seal_outcome",
    "open_outcome",
    "warm",
    "try_seal",
    "seal_takeover",
    "read_step_header",
    "seal_adopt",
    "adopt_sealed",
    "UNSEALED_OUTCOME",
    "UNSEALED_TAKEOVER",
    "UNSEALED_ADOPT",
]

log = logging.getLogger("celery_durable.activity")

#: where the key lives (its own partition: never an execution's)
KEY_PK = "celery_durable.keys"
KEY_ID = "message-seal"

_lock = threading.Lock()
_keys: weakref.WeakKeyDictionary[Store, bytes] = weakref.WeakKeyDictionary()


def _key(store: Store) -> bytes:
    with _lock:
        key = _keys.get(store)
    if key is not None:
        return key
    doc = store.read(KEY_PK, KEY_ID)
    if doc is None:
        store.create({"pk": KEY_PK, "id": KEY_ID, "type": "key", "secret": secrets.token_hex(32)})
        doc = store.read(KEY_PK, KEY_ID)  # ours, or the one that won the race
    secret = (doc or {}).get("secret")
    if not isinstance(secret, str) or len(secret) < 32:
        raise CorruptDocument(f"the message seal key ({KEY_PK}/{KEY_ID}) is missing or malformed")
    key = bytes.fromhex(secret)
    with _lock:
        _keys[store] = key
    return key


def warm(store: Store) -> None:
    """Read the key now (a worker's start), so a later store outage can still seal."""
    _key(store)


def try_seal(store: Store, purpose: str, *parts: Any) -> str | None:
    """:func:`seal`, or None when the key is not cached and the store cannot give it now."""
    try:
        return seal(store, purpose, *parts)
    except StoreError:
        return None


def _mac(store: Store, purpose: str, parts: tuple[Any, ...]) -> str:
    text = json.dumps([purpose, *parts], separators=(",", ":"), sort_keys=True)
    return hmac.new(_key(store), text.encode(), hashlib.sha256).hexdigest()


def seal(store: Store, purpose: str, *parts: Any) -> str:
    """The seal of ``parts`` (JSON values) for ``purpose``; raises StoreError if the key cannot be read."""
    return _mac(store, purpose, parts)


def verify(store: Store, mac: Any, purpose: str, *parts: Any) -> bool:
    """Whether ``mac`` is the seal of ``parts`` for ``purpose`` (constant time)."""
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(store, purpose, parts))


def seal_outcome(store: Store, step: tuple[str, int, int], token: Any, doc: Doc) -> list[str] | None:
    """``[json, mac]``: an unrecorded outcome of step ``(execution id, run, seq)`` for a message
    (None: no key to seal with; the step is then left to run again)."""
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    mac = try_seal(store, "outcome", *step, token, text)
    return [text, mac] if mac is not None else None


def open_outcome(store: Store, sealed: Any, step: tuple[str, int, int], token: Any) -> Doc | None:
    """The outcome ``sealed`` carries for this step and token; None if not sealed by us for it."""
    if not (isinstance(sealed, list) and len(sealed) == 2 and isinstance(sealed[0], str)):
        return None
    if not verify(store, sealed[1], "outcome", *step, token, sealed[0]):
        return None
    doc = json.loads(sealed[0])
    execution_id, run, seq = step
    if not isinstance(doc, dict) or (doc.get("pk"), doc.get("run"), doc.get("seq")) != (execution_id, run, seq):
        return None
    return doc


#: engine events (counters) of the messages :func:`read_step_header` drops
UNSEALED_OUTCOME = "activity_unsealed_outcome"
UNSEALED_TAKEOVER = "activity_unsealed_takeover"
UNSEALED_ADOPT = "effect_unsealed_adopt"


def seal_takeover(store: Store, step: tuple[str, int, int], token: Any, holder: str) -> str | None:
    """The seal ``hs`` of a retry message that may take over the lease of attempt ``holder``."""
    return try_seal(store, "takeover", *step, token, holder)


def read_step_header(
    store: Store, emit: Callable[..., None], meta: dict[str, Any], step: tuple[str, int, int], name: str
) -> tuple[Doc | None, bool]:
    """The sealed outcome a ``durable_step`` header carries (None: run the activity), and whether
    the message must be dropped instead (a forged outcome or takeover: logged and counted).

    Reads the key (StoreError) only for a header that carries something sealed.
    """

    def drop(event: str, what: str) -> tuple[Doc | None, bool]:
        log.warning("activity %s (%s step %d) dropped: %s", name, step[0], step[2], what)
        emit(event, execution_id=step[0], seq=step[2], activity=name)
        return None, True

    if "outcome" in meta:  # the unsealed hand-off of older versions, or a forgery: never recorded
        return drop(UNSEALED_OUTCOME, "its header carries an outcome this library did not seal")
    outcome = None
    if meta.get("sealed") is not None:
        outcome = open_outcome(store, meta["sealed"], step, meta.get("t"))
        if outcome is None:
            return drop(UNSEALED_OUTCOME, "its outcome is not sealed for this step")
    holder = meta.get("h")
    if holder is not None and not verify(store, meta.get("hs"), "takeover", *step, meta.get("t"), str(holder)):
        return drop(UNSEALED_TAKEOVER, "it names an attempt to take over without a valid seal")
    return outcome, False


def seal_adopt(store: Store, key: str, effect_id: str, value: Any) -> str | None:
    """The seal of an effect message's adopt header ``value`` (``[owners, attempt]``)."""
    return try_seal(store, "adopt", key, effect_id, value)


def adopt_sealed(store: Store, emit: Callable[..., None], key: str, effect_id: str, value: Any, mac: Any) -> bool:
    """Whether an adopt header ``value`` may be used (absent, or sealed by us); logs and counts a forgery."""
    if value is None or verify(store, mac, "adopt", key, effect_id, value):
        return True
    log.warning("effect %s (key %s): adopt header without a valid seal, ignored", effect_id, key)
    emit(UNSEALED_ADOPT, effect_id=effect_id, key=key)
    return False
