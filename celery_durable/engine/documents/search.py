"""Search attributes and memo of an execution (docs/architecture.md §5).

The exec document carries ``search`` (indexed attributes, rules in :mod:`..stores.search`) and
``memo`` (any JSON, not indexed), both set at start. ``wf.upsert_search`` changes ``search`` from
workflow code deterministically, as ``wf.set_status`` does: a replay collects every upsert from
the top of the run (:attr:`WorkflowContext.search_updates`, last call wins per key, ``None``
removes) and the drive's commit writes ``search`` merged with them when that changes it. Merging
the same updates twice gives the same result, so a replayed drive writes nothing new; a
continued run starts from the attributes the last run left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import same_json
from celery_durable.engine.documents.model import run_of
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.stores.base import Doc
from celery_durable.stores.search import check_memo, check_search, merge_search

if TYPE_CHECKING:
    from celery_durable.engine.replay.context import WorkflowContext

__all__ = ["upsert", "apply_updates", "start_fields", "run_start"]


def start_fields(search: Mapping[str, Any] | None, memo: Any) -> dict[str, Any]:
    """The exec document fields for ``start(..., search=, memo=)``, validated in the caller."""
    fields: dict[str, Any] = {}
    attrs = check_search(search)
    if attrs:
        fields["search"] = attrs
    if memo is not None:
        fields["memo"] = check_memo(memo)
    return fields


def upsert(ctx: WorkflowContext, attrs: Mapping[str, Any]) -> None:
    """Record ``attrs`` into this replay's updates (validated now: a bad value raises in the workflow)."""
    ctx.refuse_in_query("wf.upsert_search()")
    updates = check_search(attrs, allow_none=True)
    # the caps hold for what this run's upserts set together, not only per call (deterministic:
    # from this replay's calls alone; what start set is not counted, so the total stays under twice them)
    check_search({k: v for k, v in {**ctx.search_updates, **updates}.items() if v is not None})
    ctx.search_updates.update(updates)


def run_start(ex: ExecDoc) -> dict[str, Any] | None:
    """The attributes the current run started with (recorded by its first upsert), or None."""
    base = ex.get("search_run")
    if isinstance(base, dict) and base.get("run") == run_of(ex) and isinstance(base.get("search"), dict):
        return dict(base["search"])
    return None


def apply_updates(new_ex: Doc, ex: ExecDoc, updates: Mapping[str, Any]) -> bool:
    """Set ``new_ex["search"]`` from ``ex``'s and the replay's updates; True when it changed. The
    first change of a run records what the run started with (``search_run``): a reset restores
    it (engine/admin/reset.py), as the re-run replays its upserts from there."""
    if not updates:
        return False
    current = ex.get("search") if isinstance(ex.get("search"), dict) else {}
    merged = merge_search(current, updates)
    if same_json(merged, current):  # as JSON means it: Cosmos gives 3.0 back as 3 (True is not 1)
        return False
    new_ex["search"] = merged
    if run_start(ex) is None:
        new_ex["search_run"] = {"run": run_of(ex), "search": current}
    return True
