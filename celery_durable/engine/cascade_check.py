"""An operation's cascade into children, planned before the parent's first write.

``retry``, ``resume`` and ``reset`` reopen the failed or cancelled children of the steps they arm
again, each by its own operation, after the parent's commit (``Admin._operate``). A child's plan
that refuses then (a step still running: sent again it would run twice at once) left the parent
reopened, waiting on a child still failed or cancelled. So every child's plan (plans only read)
is made first, down the tree: one that refuses refuses the parent's operation before it writes.
"""

from __future__ import annotations

from typing import Any

from .oplog import cascade
from .pending_ops import PENDING
from .schema import EXEC_ID

__all__ = ["check_cascade"]

#: how deep a tree of children is planned (the parent's own forget walk stops there too)
_MAX_DEPTH = 20


def check_cascade(admin: Any, children: list[str], parent: str, depth: int = 0) -> None:
    """Plan, without writing, the operation each of ``children`` gets after ``parent``'s commit;
    raises what a plan raises (:class:`OperationRefused`)."""
    if depth > _MAX_DEPTH:
        return
    for child in children:
        docs = {d["id"]: d for d in admin.engine.store.query_partition(child).docs}
        ex = docs.get(EXEC_ID)
        if ex is None or ex.get(PENDING):
            continue  # gone, or an operation of its own half done: its cascade finishes that first
        rewrite = cascade(admin, child, parent)(ex, docs)
        check_cascade(admin, list(rewrite.children), child, depth + 1)
