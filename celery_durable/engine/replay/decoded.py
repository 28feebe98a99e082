"""Decoded step results, cached across replays of one process (docs/architecture.md §6).

A full replay (no live instance to resume: engine/replay/sticky.py) returns every recorded result to
the workflow code again. Decoding is validation against the step's declared type; its outcome
for one stored document never changes, so it is cached by (execution, run, step, etag, codec).
Workflow code must never share an object with the history (it could change what later replays
see), so only values that cannot be mutated are handed out from the cache (``None``, booleans,
numbers, strings, bytes, and tuples/frozensets of those); any other value is decoded afresh,
which is what makes it a fresh copy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from celery_durable.codecs import ValueCodec, fresh
from celery_durable.stores.base import Doc

__all__ = ["decoded"]

#: entries kept (one per recorded result of any execution this process replayed)
MAX_ENTRIES = 50_000

_lock = threading.Lock()
#: key -> (the stored value decoded, what it decoded to)
_cache: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _immutable(value: Any) -> bool:
    if type(value) in _IMMUTABLE:  # exactly: an instance of a subclass (of str, int...) takes attributes
        return True
    if type(value) in (tuple, frozenset):
        return all(_immutable(v) for v in value)
    return False


def decoded(pk: str, run: int, seq: int, doc: Doc, codec: ValueCodec, what: str) -> Any:
    """``codec.decode(doc["value"], what)``, from the cache when it was decoded before and immutable.

    A hit also needs the stored value itself to be the one decoded then (same type, equal): an
    etag is only unique within one store and one life of an id (a purged and re-created id, or
    two stores in one process, may repeat it)."""
    etag = doc.get("_etag")
    raw = doc.get("value")
    if etag is None:  # not stored yet (an outcome this drive records): nothing identifies it
        return codec.decode(raw, what)
    key = (pk, run, seq, etag, codec)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and type(hit[0]) is type(raw) and hit[0] == raw:
            _cache.move_to_end(key)
            return hit[1]
    value = codec.decode(raw, what)
    if _immutable(value):
        with _lock:
            _cache[key] = (fresh(raw), value)
            if len(_cache) > MAX_ENTRIES:
                _cache.popitem(last=False)
    return value
