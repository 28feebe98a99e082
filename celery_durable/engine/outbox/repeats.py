"""An emit's intent whose effect id is already enqueued by *another* intent (issue 23, item 2).

Admission is idempotent by effect id: the same intent admitted twice (a crash between admission
and clearing it) is one effect. A re-run's emit with an explicit ``effect_id`` is another intent
for an id that means *once ever*: its effect is not enqueued again, and it is told — a WARNING,
and its marker records ``admitted: false`` with ``reason: duplicate`` (the same payload; another
payload is an :class:`~celery_durable.errors.IdempotencyConflict`, ``reason: conflict``). Which
intent enqueued a row is its ``source``: the marker's partition, id and rerun count.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from celery_durable.engine.outbox.model import Admitted, lane_pk, row_id
from celery_durable.stores.base import Doc, Store

__all__ = ["admit_once", "source_of"]

log = logging.getLogger("celery_durable.outbox")


class _Admits(Protocol):
    @property
    def store(self) -> Store: ...

    def admit(self, effect: Doc, source: Doc | None = None) -> Admitted: ...


def source_of(intent: Mapping[str, Any]) -> Doc:
    """The ``source`` of the row an intent enqueues: its partition and id, and the rerun count
    of an emit marker (a re-run's marker has the same id as the old run's at that step)."""
    src: Doc = {"pk": intent["pk"], "id": intent["id"]}
    if "rerun" in intent:
        src["rerun"] = intent["rerun"]
    return src


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("pk"), a.get("id"), a.get("rerun") or 0) == (b.get("pk"), b.get("id"), b.get("rerun") or 0)


def admit_once(outbox: _Admits, effect: Doc, intent: Doc) -> tuple[Admitted | None, dict[str, Any]]:
    """Admit ``intent``'s effect; return it and the note its intent is cleared with."""
    admitted = outbox.admit(effect, source=intent)
    if admitted.created or intent.get("type") != "step":
        return admitted, {"admitted": True}
    row = outbox.store.read(lane_pk(admitted.key), row_id(admitted.effect_id))
    src = (row or {}).get("source")
    if row is None or (isinstance(src, Mapping) and _same(src, intent)):
        return admitted, {"admitted": True}  # this intent's own row (admitted before a crash)
    log.warning(
        "intent %s/%s not admitted: effect id %r was already enqueued by %s with the same payload; "
        "an explicit effect_id is enqueued once ever (emit without one for a new effect on each re-run)",
        intent["pk"],
        intent["id"],
        admitted.effect_id,
        src or "another enqueue",
    )
    return admitted, {"admitted": False, "reason": "duplicate"}
