"""Describing a partition that holds an undecodable document (``Admin.describe``): the documents
the exec implies, read by id, each undecodable one flagged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from celery_durable.engine.admin.timeline import ExecutionDetail, StepRecord, _int, describe_docs, summary_of
from celery_durable.engine.documents.schema import (
    marker_id,
    parse_step_id,
    result_id,
    signal_mark_id,
    signal_value_id,
    wait_decision_id,
)
from celery_durable.errors import CorruptDocument
from celery_durable.stores.base import Doc, Store

__all__ = ["salvage", "SALVAGE_MAX"]

#: the most steps (and signal values) a describe reads one by one around an undecodable document
SALVAGE_MAX = 5000


def salvage(store: Store, ex: Doc, failure: str) -> ExecutionDetail:
    """:meth:`describe` of a partition holding an undecodable document (``failure`` says which):
    the documents of the current run's steps, its input and the signal values, read by id, the
    undecodable ones flagged."""
    summary = summary_of(ex)
    run, steps, sent = summary.run, summary.steps, _int(ex.get("signal_seq"))
    ids = [
        f(seq, run) for seq in range(1, min(steps, SALVAGE_MAX) + 1) for f in (marker_id, result_id, wait_decision_id)
    ]
    ids += [f(n) for n in range(1, min(sent, SALVAGE_MAX) + 1) for f in (signal_value_id, signal_mark_id)]
    if isinstance(ex.get("payload_at"), str):
        ids.append(str(ex["payload_at"]))  # the run's input, when a document of its own
    docs, bad = _read_tolerant(store, str(ex["pk"]), ids)
    detail = describe_docs(ex, [ex, *docs])
    broken: dict[int, str] = {}
    for doc_id, why in bad.items():
        try:
            broken.setdefault(parse_step_id(doc_id)[1], why)
        except ValueError:
            pass  # a signal value: flagged below, no step of its own
    shown = {s.seq for s in detail.steps}
    timeline = [replace(s, state="corrupt", corrupt=broken[s.seq]) if s.seq in broken else s for s in detail.steps]
    timeline += [StepRecord(seq, "?", "?", "corrupt", corrupt=why) for seq, why in broken.items() if seq not in shown]
    notes = list(bad.values()) or [failure]  # not among the ids read (another run's, say): as read
    if max(steps, sent) > SALVAGE_MAX:
        notes.append(f"only the first {SALVAGE_MAX} steps and signal values were read")
    return replace(detail, steps=tuple(sorted(timeline, key=lambda s: s.seq)), corrupt=(*detail.corrupt, *notes))


def _read_tolerant(store: Store, pk: str, ids: Sequence[str]) -> tuple[list[Doc], dict[str, str]]:
    """The documents of ``ids`` that exist, and why each undecodable one is: chunks of
    ``read_many``, split in halves around a failure (a few reads per undecodable document)."""
    found: list[Doc] = []
    bad: dict[str, str] = {}
    pending = [list(ids[i : i + 500]) for i in range(0, len(ids), 500)]
    while pending:
        chunk = pending.pop()
        try:
            found += [d for d in store.read_many(pk, chunk) if d is not None]
        except CorruptDocument as exc:
            if len(chunk) == 1:
                bad[chunk[0]] = str(exc)
            else:
                half = len(chunk) // 2
                pending += [chunk[:half], chunk[half:]]
    return found, dict(sorted(bad.items()))
