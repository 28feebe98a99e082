"""Shape checks of an execution's stored documents: where a malformed document is caught.

The engine reads fields of its documents in many places (drive, scans, links). A document with a
field of the wrong type (a manual edit, a foreign tool, an old bug) would otherwise raise an
arbitrary ``AttributeError``/``TypeError`` deep inside, escaping the guards. Every path that
reads documents checks them here first, so such a document becomes a :class:`MalformedDocument`
naming it, and only its own execution is failed (``Driver.fail_corrupt``); scans go on.

Only documents the engine owns are checked (by id); unknown ids in a partition are ignored.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from celery_durable.engine.documents.records import ExecDoc, as_exec, is_terminal
from celery_durable.engine.documents.schema import (
    EXEC_ID,
    SIGNAL_MARK_PREFIX,
    SIGNAL_VALUE_PREFIX,
    Status,
    is_step_id,
    signal_mark_id,
    signal_value_id,
)
from celery_durable.engine.drive.partition_cache import Partition
from celery_durable.engine.drive.seals import KEY_PK
from celery_durable.engine.outbox.model import index_pk, lane_pk
from celery_durable.errors import CorruptDocument, InvalidWorkflowId
from celery_durable.stores.base import Doc
from celery_durable.stores.cosmos.index import lwm_pk

__all__ = [
    "MalformedDocument",
    "check_shape",
    "check_exec",
    "check_partition",
    "SIGNAL_VALUE_PREFIX",
    "SIGNAL_MARK_PREFIX",
    "signal_value_id",
    "signal_mark_id",
    "pending_signal_values",
    "consumed_by",
    "MAX_WORKFLOW_ID_LENGTH",
    "RESERVED_ID_PREFIXES",
    "check_workflow_id",
]

#: the longest workflow id a caller may give (derived child ids may grow past it with nesting)
MAX_WORKFLOW_ID_LENGTH = 200
#: partitions the engine and the stores own: the outbox's lanes and id index, Cosmos' due index
#: KEY_PK: the seal key (seals.py); "dk:": dedup keys' owners (engine/starts/dedup.py); "sch:": managed
#: schedules (engine/schedules/firing.py)
RESERVED_ID_PREFIXES = (lane_pk(""), index_pk(""), lwm_pk(""), KEY_PK, "dk:", "sch:")
#: the tail of a derived child id (``schema.child_execution_id``: ``<parent>-c<seq>[.r<run>][~<n>]``).
#: A caller's id may not end like this, so no one can take a default child id before its parent
#: starts that child (the parent would fail with ``ChildIdTaken``).
_TAIL = r"-c[0-9]+(?:\.r[0-9]+)?(?:~[0-9]+)?"
_DERIVED_CHILD_TAIL = re.compile(_TAIL + r"\Z")
#: the tails of a derived id, nested for grandchildren (``<id>-c3-c1.r2``)
_DERIVED_CHILD_TAILS = re.compile(f"(?:{_TAIL})+\\Z")
#: Unicode categories refused: control characters (newlines, NUL, DEL, C1) break logs, the CLI and
#: SQLite's text functions; lone surrogates cannot be encoded as UTF-8 (JSON, SQLite, Cosmos);
#: format characters (bidi overrides and isolates, zero-width spaces and joiners, the BOM, soft
#: hyphens) and the line/paragraph separators are invisible or reorder text, so two ids that look
#: the same in the UI and the CLI would name different executions (a phishing aid)
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Cf", "Zl", "Zp"})
#: Unicode's Default_Ignorable_Code_Point outside those categories (DerivedCoreProperties.txt):
#: combining grapheme joiner, variation selectors, Mongolian and Khmer invisibles, Hangul fillers
#: and the like, drawn as nothing
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)


def check_workflow_id(value: object, what: str = "workflow id", *, derived_ok: bool = False) -> str:
    """Return ``value`` if a caller may name an execution with it; else raise
    :class:`InvalidWorkflowId` saying why (checked in the caller, before anything is stored).

    ``derived_ok``: ``value`` may also be a derived child id of an id that passes (its tails
    stripped, nested ones too), for an id that names an existing execution and never creates
    one: a signal target (a child from its future's ``workflow_id``, a parent from
    ``poll().parent_id``)."""
    if derived_ok and isinstance(value, str):
        base = _DERIVED_CHILD_TAILS.sub("", value)
        if base:  # else all tails ("-c1"): checked whole below, refused as a derived id
            check_workflow_id(base, what)
            return value
    if not isinstance(value, str):
        raise InvalidWorkflowId(f"a {what} must be a string, got {type(value).__name__} {value!r:.60}")
    if not value.strip():
        raise InvalidWorkflowId(f"a {what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_WORKFLOW_ID_LENGTH:
        raise InvalidWorkflowId(
            f"a {what} may have at most {MAX_WORKFLOW_ID_LENGTH} characters, got {len(value)}: {value[:40]!r}..."
        )
    bad = next((c for c in value if unicodedata.category(c) in _REFUSED_CATEGORIES or _IGNORABLE.match(c)), None)
    if bad is None:  # a space other than ' ' (no-break, em, ideographic ...) looks like one
        bad = next((c for c in value if c != " " and unicodedata.category(c) == "Zs"), None)
    if bad is not None:
        raise InvalidWorkflowId(
            f"a {what} may not contain {bad!r} (a control, invisible or bidi character, or a lone surrogate):"
            f" {value!r:.80}"
        )
    if unicodedata.normalize("NFC", value) != value:  # "café" twice: precomposed, and e + U+0301
        raise InvalidWorkflowId(
            f"a {what} must be in Unicode normal form NFC (unicodedata.normalize('NFC', id)), got {value!r:.80}"
        )
    reserved = next((p for p in RESERVED_ID_PREFIXES if value.startswith(p)), None)
    if reserved is not None:
        raise InvalidWorkflowId(
            f"a {what} may not start with {reserved!r} (reserved for the engine's own partitions): {value!r:.80}"
        )
    tail = _DERIVED_CHILD_TAIL.search(value)
    if tail is not None:
        raise InvalidWorkflowId(
            f"a {what} may not end like a derived child id ({tail.group()!r}: '<parent>-c<step>'), which "
            f"is reserved for the children a parent starts without an explicit id: {value!r:.80} "
            "(use a handle to reach an existing child)"
        )
    return value


def pending_signal_values(docs: Mapping[str, Doc], name: str) -> list[Doc]:
    """Values sent for ``name`` and not yet settled (consumed, rejected or ignored), oldest first."""
    values = [
        d
        for d in docs.values()
        if d["id"].startswith(SIGNAL_VALUE_PREFIX)
        and d.get("name") == name
        and SIGNAL_MARK_PREFIX + d["id"][len(SIGNAL_VALUE_PREFIX) :] not in docs
    ]
    return sorted(values, key=lambda d: int(d["n"]))


def consumed_by(docs: Mapping[str, Doc], run: int, seq: int, names: list[str]) -> Doc | None:
    """The value of ``names`` that signal wait ``seq`` of ``run`` consumed, by its mark: a wait
    with no decision yet may have one, when a commit too large for one batch created its first
    documents (the mark) alone and its batch (the decision) failed (driver._apply)."""
    for doc in docs.values():
        if doc.get("type") == "signal_consumed" and doc.get("seq") == seq and doc.get("run", 0) == run:
            value = docs.get(str(doc.get("value_id")))
            if value is not None and value.get("name") in names:
                return value
    return None


class MalformedDocument(CorruptDocument):
    """A stored document has a field of the wrong type; ``pk``/``doc_id`` name it."""

    def __init__(self, pk: str, doc_id: str, problem: str) -> None:
        super().__init__(f"document {doc_id!r} of execution {pk!r} is malformed: {problem}")
        self.pk = pk
        self.doc_id = doc_id


_NUMBER = (int, float)
_STATUSES = frozenset(s.value for s in Status)


def _field(doc: Mapping[str, Any], key: str, types: type | tuple[type, ...], required: bool = False) -> Any:
    value = doc.get(key)
    if value is None:
        if required:
            raise ValueError(f"{key!r} is missing")
        return None
    # bool is an int in Python, never a count or a time in our documents
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise ValueError(f"{key!r} is {type(value).__name__} {value!r:.40}, not {_names(types)}")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: type | tuple[type, ...]) -> str:
    return "/".join(t.__name__ for t in _as_tuple(types))


def _exec(doc: Doc) -> None:
    _field(doc, "workflow", str, required=True)
    if doc.get("status") not in _STATUSES:
        raise ValueError(f"'status' is {doc.get('status')!r:.40}, not one of {sorted(_STATUSES)}")
    for key in ("run", "steps", "wakeups", "drives", "continued", "signal_seq"):
        _field(doc, key, int)
    _field(doc, "payload", dict)
    _field(doc, "payload_at", str)
    _field(doc, "cancel_requested", bool)
    _field(doc, "timed_out", bool)
    _field(doc, "paused", bool)
    for key in ("deadline_at", "start_at", "debounce", "queued_at", "paused_at"):  # engine/starts/, engine/limits/
        _field(doc, key, _NUMBER)
    _field(doc, "limit", dict)
    lease = _field(doc, "lease", dict)
    if lease is not None:
        _field(lease, "holder", str)
        _field(lease, "expires", _NUMBER)
    parent = _field(doc, "parent", dict)
    if parent is not None:
        _field(parent, "pk", str, required=True)
        _field(parent, "seq", int, required=True)
        _field(parent, "run", int)
    for joiner in _field(doc, "joiners", list) or []:  # parent steps that joined this child
        if not isinstance(joiner, dict):
            raise ValueError(f"'joiners' holds {type(joiner).__name__} {joiner!r:.40}, not an object")
        _field(joiner, "pk", str, required=True)
        _field(joiner, "seq", int, required=True)
        _field(joiner, "run", int)
    signals = _field(doc, "signals", list)
    if signals is not None and not all(isinstance(s, str) for s in signals):
        raise ValueError("'signals' must be a list of names")


def _clock(doc: Doc) -> None:
    """``clock:deadline`` / ``clock:start`` (engine/starts/deadlines.py)."""
    _field(doc, "kind", str, required=True)
    _field(doc, "at", _NUMBER, required=True)
    _field(doc, "fired_at", _NUMBER)


def _input(doc: Doc) -> None:
    payload = _field(doc, "payload", dict, required=True)
    _field(payload, "args", list)
    _field(payload, "kwargs", dict)
    _field(doc, "run", int)


def _step(doc: Doc) -> None:
    kind = _field(doc, "kind", str, required=True)
    _field(doc, "name", str, required=True)
    _field(doc, "seq", int, required=True)
    for key in ("run", "attempts", "lost"):
        _field(doc, key, int)
    lease = _field(doc, "lease", dict)
    if lease is not None:
        _field(lease, "expires", _NUMBER)
    if kind == "activity":
        payload = _field(doc, "input", dict, required=True)
        _field(payload, "args", list)
        _field(payload, "kwargs", dict)
        _field(doc, "task_id", str)
    elif kind == "child":
        _field(doc, "child_id", str, required=True)
        _field(doc, "input", dict)
    elif kind == "sleep":
        _field(doc, "fire_at", _NUMBER, required=True)
    elif kind == "signal":
        _field(doc, "fire_at", _NUMBER)
    elif kind == "emit":
        _field(doc, "effect", dict, required=True)


def _outcome(doc: Doc) -> None:
    for key in ("ok", "cancelled", "timeout"):
        _field(doc, key, bool)
    _field(doc, "error", dict)
    _field(doc, "signals_seen", int)


def _signal(doc: Doc) -> None:
    _field(doc, "name", str)  # a cancel recorded as the wait's outcome has none
    _outcome(doc)


def _signal_value(doc: Doc) -> None:
    _field(doc, "name", str, required=True)
    _field(doc, "n", int, required=True)


def _signal_mark(doc: Doc) -> None:
    _field(doc, "name", str, required=True)
    _field(doc, "value_id", str, required=True)
    _field(doc, "run", int)


def _update_doc(doc: Doc) -> None:
    """``upd:``/``updr:`` and ``apub:``/``apubx:`` (engine/documents/update_docs.py): what the replay reads."""
    _field(doc, "n", int, required=True)
    _field(doc, "run", int)
    head = str(doc.get("id")).partition(":")[0]
    if head == "upd":
        _field(doc, "name", str, required=True)
        _field(doc, "input", dict, required=True)
    elif head == "updr":
        _field(doc, "accepted", bool)
        _field(doc, "seq", int)
    elif head == "apub":
        _field(doc, "topic", str, required=True)


def _checker(doc_id: str) -> Any:
    if doc_id == EXEC_ID:
        return _exec
    head = doc_id.partition(":")[0]
    if head in ("upd", "updr", "apub", "apubx"):
        return _update_doc
    if head == "clock":
        return _clock
    if head.startswith("sig") and (head == "sig" or head[3:].isdigit()):
        return _signal
    if doc_id.startswith(SIGNAL_VALUE_PREFIX):
        return _signal_value
    if head.startswith("in") and (head == "in" or head[2:].isdigit()):
        return _input
    if doc_id.startswith(SIGNAL_MARK_PREFIX):
        return _signal_mark
    if is_step_id(doc_id):
        return _step
    if head[:1] == "r" and (head == "r" or head[1:].isdigit()):
        return _outcome
    if head[:1] == "w" and (head == "w" or head[1:].isdigit()):
        return _signal  # a wait's decision, or a cancel recorded as its outcome
    return None


def check_shape(pk: str, doc: Any) -> Doc:
    """Return ``doc`` if its shape is what the engine expects of its id; else raise."""
    if not isinstance(doc, dict):
        raise MalformedDocument(pk, "?", f"not a JSON object but {type(doc).__name__}")
    doc_id = str(doc.get("id"))
    check = _checker(doc_id)
    if check is not None:
        try:
            check(doc)
        except ValueError as exc:
            raise MalformedDocument(pk, doc_id, str(exc)) from None
    return doc


def check_exec(pk: str, doc: Doc | None) -> ExecDoc | None:
    """Check an exec document read on its own (``None`` passes: the execution does not exist),
    and type it (engine/documents/records.py)."""
    return None if doc is None else as_exec(check_shape(pk, doc))


#: pk -> the serial of the last partition snapshot (``cache.Partition``) found well-formed. A
#: snapshot knows which ids changed since each of its last few ancestors, so a drive checks only
#: the documents changed since the last check: work bounded by the changes, not the history.
#: Serials are never reused; a snapshot never changes once handed out (a newer one is a new object).
_checked: OrderedDict[str, int] = OrderedDict()
_checked_lock = threading.Lock()
_CHECKED_PARTITIONS = 256


def check_partition(pk: str, docs: Mapping[str, Doc]) -> None:
    """Check every engine document of a partition a drive or a scan is about to use.

    A finished execution's step documents are never read again, so only its exec is checked.
    Of a :class:`~.cache.Partition` descending from the last one checked, only the documents
    changed since are checked; any other mapping is checked whole.
    """
    ex = docs.get(EXEC_ID)
    if ex is not None:
        check_shape(pk, ex)
        if is_terminal(ex):
            return
    if not isinstance(docs, Partition):
        for doc in docs.values():
            check_shape(pk, doc)
        return
    with _checked_lock:
        last = _checked.get(pk)
    changed = None if last is None else docs.changed_since(last)
    if changed is None:
        for doc in docs.values():
            check_shape(pk, doc)
    else:
        for doc_id in changed:
            if (changed_doc := docs.get(doc_id)) is not None:
                check_shape(pk, changed_doc)
    with _checked_lock:
        _checked[pk] = docs.serial
        _checked.move_to_end(pk)
        while len(_checked) > _CHECKED_PARTITIONS:
            _checked.popitem(last=False)
