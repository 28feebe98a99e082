"""Search attributes: the rules every layer shares (docs/architecture.md §4).

An exec document may carry ``"search"``: a JSON object of indexed attributes. Keys are
identifiers of at most :data:`MAX_KEY` characters; a value is a string (at most
:data:`MAX_STR` characters), a safe integer, a finite float, a bool or a list of strings (a
*keyword list*, at most :data:`MAX_LIST` items). Stores index it so that
:meth:`Store.list_execs` with ``ExecFilter(search=...)`` costs what matches, not what is stored.

A filter is ``{attr: value}`` with scalar values, AND-ed. A value matches an attribute of the same
kind that is equal (numbers compare as numbers: ``3 == 3.0``; a bool is never a number) or, for a
keyword list, holds it. :func:`search_matches` is the reference every backend follows.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from celery_durable.codecs import difference, json_problem
from celery_durable.errors import InvalidSearchAttribute

__all__ = [
    "MAX_KEY",
    "MAX_STR",
    "MAX_LIST",
    "MAX_ATTRS",
    "MAX_MEMO_BYTES",
    "MAX_SEARCH_BYTES",
    "check_search",
    "check_filter",
    "check_memo",
    "search_matches",
    "search_terms",
    "term_of",
    "merge_search",
    "parse_pairs",
]

MAX_KEY = 64
MAX_STR = 256
MAX_LIST = 32
MAX_ATTRS = 32
#: a memo's size as compact JSON
MAX_MEMO_BYTES = 32 * 1024
#: all attributes' size as compact JSON (they stay on the exec document, never offloaded)
MAX_SEARCH_BYTES = 16 * 1024
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or len(key) > MAX_KEY or not _KEY.fullmatch(key):
        raise InvalidSearchAttribute(
            f"search attribute name {key!r} must be an identifier (letters, digits, '_') of at most {MAX_KEY} chars"
        )
    return key


def _check_scalar(key: str, value: Any) -> str | int | float | bool:
    if not isinstance(value, str | int | float):  # bool is an int
        raise InvalidSearchAttribute(
            f"search attribute {key!r}: {type(value).__name__} is not a str, int, float, bool or list of str"
        )
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise InvalidSearchAttribute(f"search attribute {key!r}: a string is at most {MAX_STR} chars")
        if "\x00" in value:  # PostgreSQL's JSONB refuses it: refused on every backend alike
            raise InvalidSearchAttribute(f"search attribute {key!r}: a string cannot hold a NUL character")
    # what no store keeps exactly, as for payloads: NaN/inf, integers and whole floats beyond
    # ±(2^53−1) (Cosmos writes 2.0**60 back as another number), lone surrogates (not UTF-8)
    problem = json_problem(value, f"search attribute {key!r}")
    if problem is not None:
        raise InvalidSearchAttribute(problem)
    return value


def _check_value(key: str, value: Any) -> Any:
    if isinstance(value, list | tuple):
        if len(value) > MAX_LIST or not all(isinstance(v, str) for v in value):
            raise InvalidSearchAttribute(
                f"search attribute {key!r}: a list holds at most {MAX_LIST} strings, got {value!r:.80}"
            )
        return [_check_scalar(key, v) for v in dict.fromkeys(value)]
    return _check_scalar(key, value)


def check_search(attrs: Mapping[str, Any] | None, *, allow_none: bool = False) -> dict[str, Any]:
    """Validated copy of ``attrs`` (a tuple becomes a list, a list loses duplicates); ``None``
    values are kept (they remove a key) only with ``allow_none``."""
    if attrs is None:
        return {}
    if not isinstance(attrs, Mapping):
        raise InvalidSearchAttribute(f"search attributes must be a mapping, not {type(attrs).__name__}")
    if len(attrs) > MAX_ATTRS:
        raise InvalidSearchAttribute(f"at most {MAX_ATTRS} search attributes, got {len(attrs)}")
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        _check_key(key)
        if value is None and allow_none:
            out[key] = None
        else:
            out[key] = _check_value(key, value)
    size = len(json.dumps(out, separators=(",", ":")))
    if size > MAX_SEARCH_BYTES:
        raise InvalidSearchAttribute(f"search attributes are {size} bytes as JSON; the limit is {MAX_SEARCH_BYTES}")
    return out


def check_filter(want: Mapping[str, Any] | None) -> dict[str, Any]:
    """A listing filter: ``{attr: scalar}`` (a list would have no single meaning; refused)."""
    out = check_search(want)
    for key, value in out.items():
        if isinstance(value, list):
            raise InvalidSearchAttribute(f"search filter {key!r}: give one value (a list matches when it holds it)")
    return out


def check_memo(memo: Any) -> Any:
    """Refuse a memo that is not JSON or over :data:`MAX_MEMO_BYTES` (compact JSON)."""
    try:
        text = json.dumps(memo, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSearchAttribute(f"the memo is not JSON: {exc}") from exc
    # what a store would give back changed (an int key, a big number, a lone surrogate): refused, as payloads
    problem = json_problem(memo, "memo") or difference(memo, json.loads(text), "memo")
    if problem:
        raise InvalidSearchAttribute(f"the memo cannot be stored exactly: {problem}")
    size = len(text)
    if size > MAX_MEMO_BYTES:
        raise InvalidSearchAttribute(f"the memo is {size} bytes as JSON; the limit is {MAX_MEMO_BYTES}")
    return memo


def parse_pairs(items: Iterable[str]) -> dict[str, Any]:
    """A filter from ``attr=value`` texts (CLI, UI): a value that reads as a JSON number, bool or
    string is that (``3``, ``1.5``, ``true``, ``"3"``), else the text itself; checked as a filter."""
    out: dict[str, Any] = {}
    for item in items:
        attr, sep, text = item.partition("=")
        if not sep:
            raise InvalidSearchAttribute(f"{item!r}: expected attr=value")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if attr.strip() in out:  # AND-ed with itself: the second would silently replace the first
            raise InvalidSearchAttribute(f"search attribute {attr.strip()!r} given twice; give one value")
        out[attr.strip()] = value if isinstance(value, str | int | float) else text
    return check_filter(out)


def merge_search(current: Mapping[str, Any] | None, updates: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with ``updates`` applied (a ``None`` value removes the key)."""
    out = dict(current or {})
    for key, value in updates.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def term_of(value: Any) -> tuple[str, Any]:
    """``(kind, value)`` of a scalar as indexed: ``s`` string, ``b`` bool, ``n`` number (a float)."""
    if isinstance(value, bool):
        return "b", value
    if isinstance(value, int | float):
        return "n", float(value) + 0.0  # -0.0 + 0.0 is 0.0: one index term (Cosmos keys by its JSON text)
    return "s", str(value)


def search_terms(search: Any) -> list[tuple[str, str, Any]]:
    """The ``(attr, kind, value)`` index terms of an exec document's ``search`` (one per list item);
    anything not following the rules is left out (a store never fails a write over it)."""
    if not isinstance(search, dict):
        return []
    terms: list[tuple[str, str, Any]] = []
    for key, value in search.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > MAX_KEY:
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, str | bool | int | float) and not (isinstance(v, float) and not math.isfinite(v)):
                terms.append((key, *term_of(v)))
    return list(dict.fromkeys(terms))


def search_matches(search: Any, want: Mapping[str, Any] | None) -> bool:
    """Whether an exec document's ``search`` passes the filter ``want`` (every attribute)."""
    if not want:
        return True
    terms = set(search_terms(search))
    return all((key, *term_of(value)) in terms for key, value in want.items())
