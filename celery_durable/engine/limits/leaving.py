"""An attempt's slot given back in the very commit that records its outcome.

On a store with cross-partition transactions (``Store.cross_partition``: SQLite, PostgreSQL), the
outcome's batch carries a rewrite of the limit document (``Store.batch_with``): the slot is freed
and the room granted to the best waiters inside that transaction, reading the document as it is
there, so it costs no store call of its own, never works from a stale copy, and a slot is never
free while its step shows no outcome. The granted steps are sent (handed off) after the commit.
Whenever the rewrite was not committed (Cosmos, an outcome dropped as stale or already recorded,
a drive that failed, a commit wider than one batch), the slot is given back as before, in a write
of its own (``Slots.release``: only this attempt's slot, so a rewrite that did commit is not
undone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.engine.limits.spec import LIMIT_DOC_ID, limit_pk
from celery_durable.engine.limits.table import grant, holds, step_key
from celery_durable.stores.base import Doc, Rewrite

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Attempt, Clock
    from celery_durable.settings import Settings
    from celery_durable.stores.base import Store

__all__ = ["Leaving", "leaving", "left"]


class _Engine(Protocol):
    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def settings(self) -> Settings: ...


class Slots(Protocol):
    """What this module uses of ``limits.slots.Slots`` (not imported: ports names this module)."""

    @property
    def engine(self) -> _Engine: ...
    def take_record(self, attempt: Attempt) -> dict[str, Any] | None: ...
    def body(self, doc: Doc, now: float) -> Doc: ...
    def remember(self, lpk: str, doc: Doc) -> None: ...
    def send_granted(self, lpk: str, granted: list[dict[str, Any]]) -> None: ...
    def release(
        self, execution_id: str, run: int, seq: int, attempt: tuple[int, str | None], record: Mapping[str, Any]
    ) -> None: ...


@dataclass
class Leaving:
    """An ended attempt's slot, to be given back in its outcome's commit."""

    attempt: Attempt
    record: Mapping[str, Any]
    rewrite: Rewrite
    #: what the rewrite wrote, and whom it granted (set inside the transaction; the last call's)
    body: Doc | None = None
    granted: list[dict[str, Any]] = field(default_factory=list)


def leaving(slots: Slots, attempt: Attempt) -> Leaving | None:
    """The rewrite giving back ``attempt``'s slot with its outcome's commit, or None (no slot, or
    the store has no cross-partition transaction: :meth:`Slots.leave` gives it back)."""
    if not getattr(slots.engine.store, "cross_partition", False):
        return None
    record = slots.take_record(attempt)
    if record is None:
        return None
    step, mine = step_key(attempt.execution_id, attempt.run, attempt.seq), (attempt.number, attempt.token)
    ttl = slots.engine.settings.lease_ttl
    out: Leaving

    def update(doc: Doc | None) -> Doc | None:
        # inside the store's transaction (maybe called again there: each call starts afresh)
        out.body, out.granted = None, []
        holders = (doc or {}).get("holders") or {}
        if doc is None or not holds(holders.get(step), mine):
            return None  # not its slot (any more): nothing to give back
        del holders[step]
        now = slots.engine.clock.now()
        out.granted = grant(doc, now, ttl)
        out.body = slots.body(doc, now)
        return out.body

    out = Leaving(attempt, record, Rewrite(limit_pk(record), LIMIT_DOC_ID, update))
    return out


def left(slots: Slots, out: Leaving) -> None:
    """After the outcome's drive: send whom the committed rewrite granted, or give the slot back
    in a write of its own if it was not committed. Never raises."""
    lpk, attempt = out.rewrite.pk, out.attempt
    if out.rewrite.etag is not None and out.body is not None:
        slots.remember(lpk, out.body | {"_etag": out.rewrite.etag})
        slots.send_granted(lpk, out.granted)
        return
    slots.release(attempt.execution_id, attempt.run, attempt.seq, (attempt.number, attempt.token), out.record)
