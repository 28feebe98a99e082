"""The public API is pinned, and the layering of docs/architecture.md §3 holds."""

from __future__ import annotations

import ast
from pathlib import Path

import celery_durable
import celery_durable.workflow

PKG = Path(celery_durable.__file__).parent

PUBLIC = {
    "Durable",
    "Workflow",
    "WorkflowOptions",
    "SharedWorkflow",
    "shared_workflow",
    "durable_activity",
    "WorkflowHandle",
    "ExecutionInfo",
    "DurableFuture",
    "DurableSettings",
    "RetryPolicy",
    "Limit",
    "DurableError",
    "ConfigurationError",
    "PayloadValidationError",
    "PayloadTooLarge",
    "InvalidWorkflowId",
    "InvalidSearchAttribute",
    "UnknownWorkflowError",
    "NonDeterminismError",
    "WorkflowFailedError",
    "WorkflowCancelledError",
    "WorkflowTimedOutError",
    "ActivityError",
    "ChildWorkflowError",
    "ExternalSignalError",
    "NonRetryableError",
    "DurableTimeoutError",
    "StoreError",
    "StoreUnavailable",
    "IdempotencyConflict",
    "DuplicateStart",
    "LaneFull",
    "QueryFailedError",
    "UnknownQueryError",
    "UpdateFailedError",
    "UpdateRefusedError",
    "UpdateRejectedError",
    "ExecutionEndedError",
    "HistoryUnavailableError",
}

WORKFLOW_API = {
    "now",
    "uuid4",
    "random",
    "gather",
    "sleep",
    "sleep_until",
    "start_timer",
    "wait_signal",
    "wait_any",
    "signal_external",
    "continue_as_new",
    "emit",
    "Saga",
    "in_workflow",
    "DurableFuture",
    "execution_id",
    "set_query_handler",
    "query",
    "set_status",
    "upsert_search",
    "patched",
    "deprecate_patch",
    "publish",
    "set_event",
    "set_update_handler",
    "update",
}


def test_public_api_is_pinned() -> None:
    assert set(celery_durable.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(celery_durable, name) is not None


def test_workflow_api_is_pinned() -> None:
    assert set(celery_durable.workflow.__all__) == WORKFLOW_API


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


#: the folders (and modules) that may import Celery or kombu; the rest of the package cannot see it
CELERY_ROOMS = ("glue", "cli", "ui", "testing", "app.py")


def test_celery_is_imported_only_in_its_rooms() -> None:
    """Celery and kombu are imported only under glue/, cli/, ui/, testing/ and app.py (issue 24)."""
    seen = set()
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        celery = {m for m in _imports(path) if m.split(".")[0] in ("celery", "kombu")}
        if rel.parts[0] in CELERY_ROOMS:
            seen.update(rel.parts[:1] if celery else ())
            continue
        assert not celery, f"{rel} imports {celery}: only {', '.join(CELERY_ROOMS)} may"
    assert {"glue", "app.py", "testing"} <= seen  # the check reads imports at all


def test_public_aliases_are_the_glue_objects() -> None:
    """``celery_durable.signals``, ``.metrics``, ``.outbox`` and ``.contrib.filesystem`` are documented paths."""
    import celery_durable.contrib.filesystem
    import celery_durable.glue.filesystem_transport
    import celery_durable.glue.hooks
    import celery_durable.signals

    assert celery_durable.signals.workflow_completed is celery_durable.glue.hooks.workflow_completed
    assert set(celery_durable.signals.__all__) == set(celery_durable.glue.hooks.__all__)
    assert celery_durable.contrib.filesystem.Transport is celery_durable.glue.filesystem_transport.Transport
    import celery_durable.glue.metrics
    import celery_durable.metrics

    assert celery_durable.metrics.serve is celery_durable.glue.metrics.serve

    import celery_durable.glue.outbox
    import celery_durable.outbox

    assert celery_durable.outbox.effect_context is celery_durable.glue.outbox.effect_context
    assert celery_durable.outbox.EffectCancelled is celery_durable.glue.outbox.EffectCancelled
    assert set(celery_durable.outbox.__all__) >= {"OUTBOX_SCAN_TASK", "EFFECT_TASK_PREFIX", "effect_context"}
    # the operator's overview (issue 25): its value types on the public path, its calls on ``durable.outbox``
    assert celery_durable.outbox.Problems is celery_durable.glue.outbox.Problems
    assert celery_durable.outbox.StuckLane is celery_durable.glue.outbox.StuckLane
    assert {"Problems", "StuckLane"} <= set(celery_durable.outbox.__all__)
    import inspect

    Outbox = celery_durable.outbox.Outbox
    assert list(inspect.signature(Outbox.problems).parameters) == ["self", "limit"]
    assert list(inspect.signature(Outbox.retry).parameters) == ["self", "effect_id"]


def test_only_stores_touch_backend_libraries() -> None:
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ("stores", "testing"):
            continue
        bad = {m for m in _imports(path) if m.split(".")[0] in ("azure", "sqlite3")}
        assert not bad, f"{rel} imports {bad}"


def test_modules_stay_small() -> None:
    """The package's modules and the harness's (the simulation), each under 600 lines."""
    files = [*PKG.rglob("*.py"), *(PKG.parent / "harness").rglob("*.py")]
    big = [(p.relative_to(PKG.parent), n) for p in files if (n := len(p.read_text().splitlines())) > 600]
    assert not big, f"modules over 600 lines, split them by concern: {big}"


def test_py_typed_marker_ships() -> None:
    assert (PKG / "py.typed").exists()


def test_operator_api_is_pinned() -> None:
    """The read model on ``Durable`` (the CLI and scripts use it): names and parameters."""
    import inspect

    from celery_durable import Durable

    expected = {
        "executions": ["self", "workflow", "status", "limit", "cursor", "created_after", "created_before", "search"],
        "list_executions": [
            "self",
            "workflow",
            "status",
            "started_after",
            "started_before",
            "search",
            "limit",
            "cursor",
        ],
        "describe": ["self", "workflow_id"],
        # by/reason: every operator action is recorded with who and why (issue 23, item 4)
        "retry": ["self", "workflow_id", "by", "reason"],
        "resume": ["self", "workflow_id", "by", "reason"],
        "terminate": ["self", "workflow_id", "by", "reason"],
        "purge": ["self", "older_than", "dry_run", "progress", "by", "reason", "matched"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(Durable, name)).parameters) == params, name
    assert isinstance(Durable.__dict__["admin"], property)
