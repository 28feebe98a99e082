"""The documents of workflow updates (engine/replay/updates.py, engine/signals/updates.py) as
types, declared in :mod:`.records`' ``FIELDS``, and their ids.

* ``upd:000003`` — the 3rd update request sent to the execution (any run): its name and
  arguments, created in one batch with a bump of the exec (``update_seq``), like a signal value.
* ``updr:000003`` — its outcome, create-only, written by the replay that decided it: rejected
  (by its validator, its arguments or an unknown name: no step of the history), or accepted
  (``seq``: the ``update`` step that applied it) with the handler's value or error. One id for
  both, so a request can never be both rejected and accepted.
* ``updk:<digest>`` — the key of a request sent with an ``update_id``: a resend finds it and
  waits for the first request's outcome instead of sending another.
* ``apub:000004`` — the 4th value an activity published (``activity.publish``), created in one
  batch with a bump of the exec (``published``); ``apubx:000004`` — its adoption into the
  stream: the replay took it as a ``publish`` step (engine/replay/updates.py), create-only.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypedDict

from celery_durable.engine.documents.schema import marker_id
from celery_durable.errors import DocumentTooLarge, PayloadTooLarge
from celery_durable.stores.base import Store, encode_doc, payload_limit

__all__ = [
    "UPDATE_REQUEST_PREFIX",
    "UPDATE_OUTCOME_PREFIX",
    "UPDATE_KEY_PREFIX",
    "update_request_id",
    "update_outcome_id",
    "update_key_id",
    "UpdateRequestDoc",
    "UpdateOutcomeDoc",
    "UpdateKeyDoc",
    "ExecUpdateFields",
    "MarkerUpdateFields",
    "PUBLICATION_PREFIX",
    "PUBLICATION_MARK_PREFIX",
    "publication_id",
    "publication_mark_id",
    "PublicationDoc",
    "PublicationMarkDoc",
    "UPDATE_FIELDS",
    "UPDATE_KINDS",
    "check_step_fits",
    "check_fits",
    "WIDE",
    "WIDE_TIME",
]

UPDATE_REQUEST_PREFIX = "upd:"
UPDATE_OUTCOME_PREFIX = "updr:"
UPDATE_KEY_PREFIX = "updk:"
PUBLICATION_PREFIX = "apub:"
PUBLICATION_MARK_PREFIX = "apubx:"


def publication_id(n: int) -> str:
    return f"{PUBLICATION_PREFIX}{n:06d}"


def publication_mark_id(n: int) -> str:
    return f"{PUBLICATION_MARK_PREFIX}{n:06d}"


def update_request_id(n: int) -> str:
    return f"{UPDATE_REQUEST_PREFIX}{n:06d}"


def update_outcome_id(n: int) -> str:
    return f"{UPDATE_OUTCOME_PREFIX}{n:06d}"


def update_key_id(update_id: str) -> str:
    return UPDATE_KEY_PREFIX + hashlib.sha256(update_id.encode()).hexdigest()[:32]


#: a step's numbers at their widest (run, seq, time): the probes of :func:`check_fits`
WIDE, WIDE_TIME = 10**9, 1e10 / 3


def check_fits(store: Store, probe: dict[str, Any], what: str) -> None:
    """Raise :class:`PayloadTooLarge` (about ``what``) when ``probe``, the widest document a value
    becomes when the workflow takes it, would not fit ``store``."""
    try:
        encode_doc(probe, payload_limit(store))
    except DocumentTooLarge as exc:
        raise PayloadTooLarge(what, exc.size, exc.limit) from None


def check_step_fits(
    store: Store, pk: str, kind: str, name: str, fields: dict[str, Any], numbers: tuple[str, ...] = ()
) -> None:
    """Raise :class:`PayloadTooLarge` in the caller, before anything is stored, when the step a
    request or a published value becomes (its marker: ``fields``, the ``numbers`` at their widest
    and the step's own) would not fit the store: recorded anyway, that step would fail the
    execution's commit, and with it the execution."""
    probe = {"pk": pk, "id": marker_id(WIDE, WIDE), "type": "step", "run": WIDE, "seq": WIDE, "kind": kind}
    probe.update(name=name, created_at=WIDE_TIME, **fields, **dict.fromkeys(numbers, WIDE))
    check_fits(store, probe, f"the {kind} step of {name!r}")


class _UpdateDoc(TypedDict, total=False):
    pk: str
    id: str
    type: str
    _etag: str


class UpdateRequestDoc(_UpdateDoc, total=False):
    """``upd:000003``: the 3rd update request (its handler's arguments ``{"args", "kwargs"}``)."""

    n: int
    name: str
    input: dict[str, Any]
    run: int
    sent_at: float
    update_id: str


class UpdateOutcomeDoc(_UpdateDoc, total=False):
    """``updr:000003``: how request 3 ended; create-only."""

    n: int
    name: str
    run: int
    #: accepted: the ``update`` step that applied it; rejected: the step it would have taken (none
    #: took it): an operator's reset forgets the outcomes after its step (engine/admin/operator.py)
    seq: int
    accepted: bool
    ok: bool
    value: Any
    error: dict[str, Any] | None
    at: float


class UpdateKeyDoc(_UpdateDoc, total=False):
    """``updk:<digest>``: a request sent with ``update_id``; ``n`` is its request."""

    update_id: str
    n: int


class PublicationDoc(_UpdateDoc, total=False):
    """``apub:000004``: a value published by an activity's attempt (step ``seq`` of ``run``)."""

    n: int
    topic: str
    value: Any
    run: int
    seq: int
    attempt: int
    #: its place among the values this attempt published (1, 2, ...)
    k: int
    at: float


class PublicationMarkDoc(_UpdateDoc, total=False):
    """``apubx:000004``: value 4 was taken into the stream as step ``seq`` of ``run``."""

    n: int
    run: int
    seq: int


class ExecUpdateFields(TypedDict, total=False):
    """The exec's counts of update requests sent and of values activities published (the last ``n``)."""

    update_seq: int
    published: int


class MarkerUpdateFields(TypedDict, total=False):
    """An ``update`` step's marker: the request it applied (its name is the update's)."""

    request: int
    #: a ``publish`` step taking an activity's value: its ``apub:<n>``, the step and attempt that published it
    publication: int
    from_step: int
    attempt: int


#: added to records.FIELDS / records.KINDS
UPDATE_FIELDS: dict[str, Any] = {
    "update_request": UpdateRequestDoc,
    "update_outcome": UpdateOutcomeDoc,
    "update_key": UpdateKeyDoc,
    "publication": PublicationDoc,
    "publication_mark": PublicationMarkDoc,
}
UPDATE_KINDS: dict[str, str] = {k: k for k in UPDATE_FIELDS}
