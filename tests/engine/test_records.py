"""The engine's document types (engine/documents/records.py) say what the engine stores.

The plugin tests/plugins/records.py fails any test that writes a field a type does not declare;
here: that it can fail, that the simulations' documents also have the declared *types*, and that
what ``check_shape`` checks is declared.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from celery_durable.engine.documents import checks, records, update_docs
from celery_durable.engine.documents.records import FIELDS, KINDS, record_type, undeclared
from celery_durable.engine.documents.schedule_docs import ScheduleDoc
from celery_durable.engine.documents.schema import DocType
from celery_durable.stores.base import find_inner
from celery_durable.stores.memory import MemoryStore
from harness import outbox_sim, sim

REPO = Path(__file__).resolve().parents[2]

TYPES: dict[str, type] = {
    "exec": records.ExecDoc,
    "marker": records.MarkerDoc,
    "outcome": records.OutcomeDoc,
    "wait_decision": records.WaitDecisionDoc,
    "signal_value": records.SignalValueDoc,
    "signal_mark": records.SignalMarkDoc,
    "operation": records.OperationDoc,
    "lane_head": records.LaneHeadDoc,
    "lane_row": records.LaneRowDoc,
    "operation_part": records.OperationPartDoc,
    "purge_record": records.PurgeRecordDoc,
    "signal_key": records.SignalKeyDoc,
    "seal_key": records.SealKeyDoc,
    "effect_index": records.EffectIndexDoc,
    "effect_intent": records.EffectIntentDoc,
    "input": records.InputDoc,
    "dedup_owner": records.DedupOwnerDoc,
    "clock": records.ClockDoc,
    "limit": records.LimitDoc,
    "schedule": ScheduleDoc,
    "update_request": update_docs.UpdateRequestDoc,
    "update_outcome": update_docs.UpdateOutcomeDoc,
    "update_key": update_docs.UpdateKeyDoc,
    "publication": update_docs.PublicationDoc,
    "publication_mark": update_docs.PublicationMarkDoc,
}


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a stored JSON value fits a field's annotation (TypedDicts as objects, shallow)."""
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if typing.is_typeddict(hint):
        return isinstance(value, dict)
    if origin is not None:
        return isinstance(value, origin)
    if hint is float:  # JSON has one number type: 3 is a fine time
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def mistyped(doc: Mapping[str, Any]) -> list[str]:
    """The fields of ``doc`` whose value does not fit its type's annotation."""
    kind = record_type(doc)
    if kind is None:
        return []
    hints = get_type_hints(TYPES[kind])
    return [f"{k}={doc[k]!r:.40} is not {hints[k]}" for k in doc if k in hints and not _conforms(doc[k], hints[k])]


def _documents(store: Any) -> Iterator[dict[str, Any]]:
    # the memory store itself, also when a tracer provider (set by tests/unit/test_tracing.py,
    # once per process) made the engine wrap it in a TracedStore
    inner: MemoryStore = find_inner(store, lambda s: isinstance(s, MemoryStore))
    for part in inner._parts.values():
        for _, body in part.values():
            yield body


def _sim_store(seed: int) -> MemoryStore:
    store = MemoryStore()
    result = sim.run_seed(seed, sim.Faults.parse("all"), store=store)
    assert result.ok, result.violations[:3]
    return store


def _outbox_store(seed: int) -> MemoryStore:
    store = MemoryStore()
    result = outbox_sim.run_seed(seed, outbox_sim.Faults.parse("all"), store=store)
    assert result.ok, result.violations[:3]
    return store


def test_a_field_no_type_declares_is_found() -> None:
    doc = {"pk": "e", "id": "exec", "type": "exec", "workflow": "w", "status": "running", "rnu": 1}
    assert undeclared(doc) == {"rnu"}
    assert undeclared({**doc, "type": "step", "kind": "sleep", "fire_at": 1.0}) == {"workflow", "status", "rnu"}
    # the stores' own keys and documents of no engine type are not the types' to describe
    assert undeclared({"pk": "e", "id": "exec", "type": "exec", "_etag": "1", "~offload": {}}) == set()
    assert undeclared({"pk": "p", "id": "d", "anything": 1}) == set()


def test_every_document_type_the_engine_writes_has_a_declared_type() -> None:
    """A new document type without its TypedDict would go unchecked: each has one."""
    assert set(TYPES) == set(FIELDS) == set(KINDS.values())
    assert {t.value for t in DocType} <= set(KINDS)
    engine = Path(records.__file__).parents[1]
    written = set()
    for path in engine.rglob("*.py"):
        written |= set(re.findall(r'"type": "([a-z_]+)"', path.read_text()))
    written -= {"chunk"}  # the offload store's own documents (stores/offload), not the engine's
    assert written <= set(KINDS), written - set(KINDS)


def test_a_value_of_the_wrong_type_is_found() -> None:
    good = {"pk": "e", "id": "exec", "type": "exec", "run": 2, "lease": {"holder": "h", "expires": 3}}
    assert mistyped(good) == []
    assert mistyped({**good, "run": "2"}) and mistyped({**good, "run": True}) and mistyped({**good, "lease": "h"})


def test_every_field_check_shape_reads_is_declared() -> None:
    """The runtime check and the types name the same fields (a field checked but not typed, or
    renamed in one place only, fails here)."""
    tree = ast.parse(Path(checks.__file__).read_text())
    kinds = {
        "_exec": "exec",
        "_step": "marker",
        "_outcome": "outcome",
        "_signal": "wait_decision",
        "_signal_value": "signal_value",
        "_signal_mark": "signal_mark",
        "_input": "input",
        "_clock": "clock",
    }
    seen = 0
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in kinds):
        names: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_field":
                target, key = node.args[0], node.args[1]
                if isinstance(target, ast.Name) and target.id == "doc" and isinstance(key, ast.Constant):
                    names.add(key.value)
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
                names |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
                if isinstance(node.args[0], ast.Constant) and getattr(node.func.value, "id", None) == "doc":
                    names.add(node.args[0].value)
        assert names, fn.name
        seen += len(names)
        assert names <= FIELDS[kinds[fn.name]], (fn.name, names - FIELDS[kinds[fn.name]])
    assert seen > 30


@pytest.mark.parametrize("seed", range(8))
def test_the_simulations_store_only_declared_fields_of_the_declared_types(seed: int) -> None:
    """Workflows with every fault (timers, signals, children, crashes, operator operations) and
    the outbox's simulation: every document they leave has its type's fields and value types."""
    problems: list[str] = []
    kinds: set[str] = set()
    for stores in (_sim_store(seed), _outbox_store(seed)):
        for doc in _documents(stores):
            kind = record_type(doc)
            if kind is None:
                continue
            kinds.add(kind)
            problems += [f"{doc['pk']}/{doc['id']}: undeclared {f}" for f in sorted(undeclared(doc))]
            problems += [f"{doc['pk']}/{doc['id']}: {p}" for p in mistyped(doc)]
    assert not problems, "\n".join(problems[:20])
    assert {"exec", "marker", "outcome", "lane_head"} <= kinds  # the run wrote what it checks


def test_the_plugin_fails_a_test_that_writes_an_undeclared_field(tmp_path: Path) -> None:
    """The harness can fail: a test writing a misspelt field errors, naming the document and the field."""
    (tmp_path / "test_inner.py").write_text(
        "from celery_durable.stores.memory import MemoryStore\n"
        "def test_writes() -> None:\n"
        "    MemoryStore().create({'pk': 'e1', 'id': 'exec', 'type': 'exec', 'workflow': 'w', 'wakeupz': 1})\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_inner.py"), "-p", "tests.plugins.records", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 passed, 1 error" in proc.stdout and "'e1'/'exec' (exec): ['wakeupz']" in proc.stdout, proc.stdout[-2000:]


def test_a_purge_and_an_enqueue_write_only_declared_documents() -> None:
    """The purge record and the outbox's effect index (found by a review: they had no type, so
    the plugin never looked at them)."""
    from celery import Celery

    from celery_durable import Durable
    from celery_durable.engine.admin.operator import Admin
    from celery_durable.testing.env import WorkflowEnvironment

    app = Celery("records-kinds", set_as_current=False, broker="memory://")
    durable = Durable(app, store="memory://")

    @durable.effect("records.note")
    def note(text: str) -> None:
        pass

    @durable.workflow(name="records.plain")
    def plain(x: int) -> int:
        return x + 1

    store = MemoryStore()
    env = WorkflowEnvironment(durable, store=store)
    h = env.start(plain, 1, _workflow_id="records-purged")
    assert env.result(h) == 2
    env.clock.advance(10)
    Admin(env.engine).purge(older_than=1, by="records", reason="test")
    durable.outbox.enqueue("records.note", "hi", key="k1", effect_id="e1")
    docs = [*_documents(store), *_documents(durable.store)]
    assert {"purge_record", "effect_index", "lane_head", "lane_row"} <= {record_type(d) for d in docs}
    assert all(record_type(d) is not None for d in docs), [d for d in docs if record_type(d) is None]
    assert not [(d["id"], undeclared(d), mistyped(d)) for d in docs if undeclared(d) or mistyped(d)]
