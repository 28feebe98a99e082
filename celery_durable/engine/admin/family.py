"""An execution's family for the UI: the chain of parents up to the root and its own children's
tree, each with its status, read with bounded cost (a page must not walk a 10,000-child fan-out).

Parents are point reads of their exec documents (at most :data:`MAX_UP`); each child's own children
come from its partition's step markers (one query per node, at most :data:`MAX_NODES` nodes,
:data:`MAX_DEPTH` levels): what was not read is counted in ``more``, never silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_durable.engine.admin.timeline import ExecutionSummary
from celery_durable.engine.documents.schema import EXEC_ID, DocType, StepKind
from celery_durable.errors import CorruptDocument, StoreUnavailable
from celery_durable.stores.base import Doc, Store

__all__ = ["Member", "family", "MAX_UP", "MAX_DEPTH", "MAX_NODES"]

#: parents followed up from the execution (a deeper chain shows its top as ``more``)
MAX_UP = 10
#: levels of children shown below the execution
MAX_DEPTH = 3
#: executions shown below the execution, all levels together
MAX_NODES = 50


@dataclass(frozen=True)
class Member:
    id: str
    #: 0 for the topmost parent found; the execution itself is at the depth of its parents' count
    depth: int
    workflow: str | None = None
    status: str | None = None
    #: the execution whose page this is
    current: bool = False
    #: its exec document is gone (purged) or cannot be read
    missing: str | None = None
    #: children (or, on the first row, parents) that exist and are not shown
    more: int = 0


def _parent_of(ex: Doc | None) -> str | None:
    parent = ex.get("parent") if ex is not None else None
    pk = parent.get("pk") if isinstance(parent, dict) else None
    return pk if isinstance(pk, str) and pk else None


def _exec(store: Store, pk: str) -> tuple[Doc | None, str | None]:
    try:
        ex = store.read(pk, EXEC_ID)
    except StoreUnavailable:
        raise
    except CorruptDocument as exc:
        return None, f"undecodable: {exc}"
    return ex, (None if ex is not None else "not found (purged?)")


def _children(store: Store, pk: str) -> tuple[Doc | None, list[str], str | None]:
    """The exec of ``pk`` and the child ids its current run's steps started, in step order."""
    try:
        docs = store.query_partition(pk).docs
    except StoreUnavailable:
        raise
    except CorruptDocument as exc:
        ex, why = _exec(store, pk)
        return ex, [], why or f"some documents are undecodable: {exc}"
    ex = next((d for d in docs if d.get("id") == EXEC_ID), None)
    if ex is None:
        return None, [], "not found (purged?)"
    run = ex.get("run") or 0
    steps = [
        d
        for d in docs
        if d.get("type") == DocType.STEP and d.get("kind") == StepKind.CHILD and (d.get("run") or 0) == run
    ]
    try:
        steps.sort(key=lambda d: int(d.get("seq") or 0))
    except (TypeError, ValueError) as exc:
        return ex, [], f"a malformed step document ({exc})"
    return ex, [str(d["child_id"]) for d in steps if isinstance(d.get("child_id"), str)], None


def _member(pk: str, depth: int, ex: Doc | None, missing: str | None, more: int = 0) -> Member:
    workflow = ex.get("workflow") if ex is not None else None
    status = ex.get("status") if ex is not None else None
    return Member(
        pk,
        depth,
        workflow if isinstance(workflow, str) else None,
        status if isinstance(status, str) else None,
        missing=missing,
        more=more,
    )


def family(store: Store, me: ExecutionSummary, children: tuple[str, ...]) -> list[Member]:
    """The family of execution ``me`` in display order: its parents (topmost first), itself, then
    its children depth first (``children``: its current run's, as its page read them). A row with
    an empty ``id`` stands for the ``more`` children not shown."""
    chain: list[tuple[str, Doc | None, str | None]] = []
    seen = {me.id}
    up, more_up = me.parent, 0
    while up is not None and up not in seen:
        if len(chain) == MAX_UP:
            more_up = 1  # at least one more above
            break
        seen.add(up)
        ex, why = _exec(store, up)
        chain.append((up, ex, why))
        up = _parent_of(ex)
    chain.reverse()
    out = [_member(pk, i, ex, why, more=more_up if i == 0 else 0) for i, (pk, ex, why) in enumerate(chain)]
    base = len(chain)
    out.append(Member(me.id, base, me.workflow, me.status, current=True))
    budget = [MAX_NODES]

    def below(ids: list[str], level: int) -> list[Member]:
        rows: list[Member] = []
        for n, child in enumerate(ids):
            if child in seen:
                continue
            if budget[0] == 0:
                rows.append(Member("", base + level, more=len(ids) - n))
                break
            seen.add(child)
            budget[0] -= 1
            ex, grand, why = _children(store, child)
            if level < MAX_DEPTH:
                rows.append(_member(child, base + level, ex, why))
                rows.extend(below(grand, level + 1))
            else:
                rows.append(_member(child, base + level, ex, why, more=len(grand)))
        return rows

    out.extend(below(list(children), 1))
    return out
