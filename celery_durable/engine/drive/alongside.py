"""Rewrites of other partitions committed with the batch that records a drive's carried outcome.

An ended attempt's limit slot is given back inside its outcome's commit (engine/limits/leaving.py):
the drive takes the rewrite (``Driver.drive(also=...)``) and whichever of its batches creates a
carried document (the commit, a deferred or late record, a lease claim) commits it with
``Store.batch_with``. A batch that fails before applying keeps the rewrite for the next round's;
whoever asked checks ``Rewrite.etag`` afterwards (set only when it was committed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from celery_durable.stores.base import Op, Rewrite

if TYPE_CHECKING:
    from celery_durable.stores.base import Doc, Store

__all__ = ["Alongside"]


class Alongside:
    """A drive's rewrites, waiting for the batch that records what it carries."""

    def __init__(self, also: Sequence[Rewrite], carry: Sequence[Doc]) -> None:
        self.rewrites = list(also)
        self.carried = frozenset(str(x["id"]) for x in carry)

    def batch(self, store: Store, pk: str, ops: Sequence[Op]) -> list[str | None]:
        """``store.batch(pk, ops)``, with the rewrites if ``ops`` create a carried document."""
        if not self.rewrites or not any(op.kind == "create" and op.doc_id in self.carried for op in ops):
            return store.batch(pk, ops)
        rewrites, self.rewrites = self.rewrites, []
        try:
            return store.batch_with(pk, ops, rewrites)
        except BaseException:
            if all(r.etag is None for r in rewrites):
                self.rewrites = rewrites  # not committed: the next round's batch carries them
            raise
