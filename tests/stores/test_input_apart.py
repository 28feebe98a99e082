"""Issue 28 (Cosmos cost): a workflow's large input is a document of its own, written once per run.

Every step rewrites the exec document; carrying the input in it made each step pay for writing the
input again (on Cosmos ~5.5 RU per KB, ``bench/cosmos_ru.py``). An input over ``INLINE_PAYLOAD``
is stored in ``in:payload`` (``in<run>:payload`` after continue-as-new), named by the exec's
``payload_at``; small inputs stay inline. Run on every backend: memory, SQLite, PostgreSQL, Cosmos.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.model import INLINE_PAYLOAD, payload_of, settled
from celery_durable.engine.documents.schema import input_id, task_id_of
from celery_durable.errors import WorkflowCancelledError, WorkflowFailedError
from celery_durable.stores.base import Op, Store
from celery_durable.testing.env import WorkflowEnvironment

BIG = "b" * (2 * INLINE_PAYLOAD)


@durable_activity(name="tests.input_apart.grow")
def grow(data: str, i: int) -> str:
    return f"{data[:8]}{i}"


class Recording:
    """Wraps a store; keeps every exec document written (create, replace, batch) in order."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.exec_writes: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _seen(self, doc: dict[str, Any] | None) -> None:
        if doc is not None and doc.get("id") == "exec":
            self.exec_writes.append(dict(doc))

    def create(self, doc: dict[str, Any]) -> Any:
        self._seen(doc)
        return self.inner.create(doc)

    def replace(self, doc: dict[str, Any], if_match: str | None) -> Any:
        self._seen(doc)
        return self.inner.replace(doc, if_match)

    def batch(self, pk: str, ops: Sequence[Op]) -> Any:
        for op in ops:
            self._seen(op.doc)
        return self.inner.batch(pk, ops)


def _app(store: Any) -> tuple[WorkflowEnvironment, Any, Any, Any, Any]:
    durable = Durable(Celery("input-apart", set_as_current=False), store="memory://")

    @durable.workflow(name="tests.input_apart.steps")
    def steps(data: str, n: int) -> list[str]:
        return [grow(data, i) for i in range(n)]

    @durable.workflow(name="tests.input_apart.rounds")
    def rounds(data: str, left: int) -> str:
        grow(data, left)
        if left:
            # big, small, big again: the input moves out, back inline, out again
            wf.continue_as_new(BIG + "again" if left % 2 == 1 else "small", left - 1)
        return data[:12] + f"/{len(data)}"

    @durable.workflow(name="tests.input_apart.parent")
    def parent(data: str) -> list[str]:
        first = child.start_child(data, _workflow_id=f"{wf.execution_id()}-kid").result()
        again = child.start_child(data, _workflow_id=f"{wf.execution_id()}-kid").result()  # joins: same input
        return [first, again]

    @durable.workflow(name="tests.input_apart.child")
    def child(data: str) -> str:
        return grow(data, len(data))

    @durable.workflow(name="tests.input_apart.naps")
    def naps(data: str) -> str:
        wf.sleep(60)
        return grow(data, 1)

    return WorkflowEnvironment(durable, store=store), steps, rounds, parent, naps


def test_a_large_input_is_written_once_and_no_step_rewrites_it(store: Store) -> None:
    rec = Recording(store)
    env, steps, *_ = _app(rec)
    h = env.start(steps, BIG, 4)
    assert env.result(h) == [f"{BIG[:8]}{i}" for i in range(4)]
    assert len(rec.exec_writes) >= 5  # the start, each step's commit, the end
    for doc in rec.exec_writes:
        assert "payload" not in doc and doc["payload_at"] == input_id(0)
        assert BIG not in json.dumps(doc)
    stored = store.read(h.id, input_id(0))
    assert stored is not None and stored["payload"] == {"args": [BIG, 4], "kwargs": {}}
    assert Admin(env.engine).describe(h.id).payload == {"args": [BIG, 4], "kwargs": {}}


def test_a_small_input_stays_in_the_exec(store: Store) -> None:
    env, steps, *_ = _app(store)
    h = env.start(steps, "small", 1)
    assert env.result(h) == ["small0"]
    ex = store.read(h.id, "exec")
    assert ex is not None and ex["payload"] == {"args": ["small", 1], "kwargs": {}} and "payload_at" not in ex
    assert store.read(h.id, input_id(0)) is None


def test_continue_as_new_moves_each_runs_input_and_prunes_the_old_ones(store: Store) -> None:
    env, _, rounds, *_ = _app(store)
    h = env.start(rounds, BIG, 4)  # runs: BIG, small, BIG+again, small, BIG+again
    assert env.result(h) == (BIG + "again")[:12] + f"/{len(BIG) + 5}"
    ex = store.read(h.id, "exec")
    assert ex is not None and ex["run"] == 4 and ex["payload_at"] == input_id(4) and "payload" not in ex
    inputs = sorted(d["id"] for d in store.query_partition(h.id).docs if d.get("type") == "input")
    assert inputs == [input_id(4)]  # the earlier runs' inputs went with their runs
    assert payload_of(ex, {input_id(4): store.read(h.id, input_id(4)) or {}})["args"] == [BIG + "again", 0]


def test_a_child_with_a_large_input_is_joined_with_the_same_input(store: Store) -> None:
    env, _, _, parent, _ = _app(store)
    h = env.start(parent, BIG)
    assert env.result(h) == [f"{BIG[:8]}{len(BIG)}"] * 2
    kid = store.read(f"{h.id}-kid", "exec")
    assert kid is not None and kid["payload_at"] == input_id(0)


def test_a_missing_input_document_fails_the_execution_clearly(store: Store) -> None:
    env, *_, naps = _app(store)
    h = env.start(naps, BIG)
    assert env.cancel(h)
    with pytest.raises(WorkflowCancelledError):
        env.result(h)
    # a replay that needs the input (a reset replays from the start) finds it gone
    store.delete(h.id, input_id(0))
    h.reset(1)
    with pytest.raises(WorkflowFailedError, match="input document 'in:payload' is missing"):
        env.result(h)


def test_an_input_document_without_an_exec_is_overwritten_not_joined(store: Store) -> None:
    env, steps, *_ = _app(store)
    store.create({"pk": "stray", "id": input_id(0), "type": "input", "run": 0, "payload": {"args": ["old", 1]}})
    h = env.start(steps, BIG, 1, _workflow_id="stray")
    assert env.result(h) == [f"{BIG[:8]}0"]
    doc = store.read("stray", input_id(0))
    assert doc is not None and doc["payload"]["args"] == [BIG, 1]


def test_a_settled_marker_holds_no_null_due_fields_and_its_task_id_is_derived() -> None:
    marker = {"pk": "p", "id": "s2:000003", "run": 2, "seq": 3, "lease": {"holder": "h"}, "due_kind": "activity"}
    assert settled(marker) == {"pk": "p", "id": "s2:000003", "run": 2, "seq": 3}
    assert task_id_of(marker) == "p:2:3" and task_id_of(marker | {"run": 0}) == "p:3"
    assert task_id_of(marker | {"task_id": "recorded"}) == "recorded"  # a marker written before
