"""Queries and custom status (issue 13, item 1): a read-only replay answers ``handle.query``; the
workflow's ``wf.set_status`` is recorded on the exec and shown by ``poll()``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_durable import (
    Durable,
    HistoryUnavailableError,
    PayloadValidationError,
    QueryFailedError,
    UnknownQueryError,
    UnknownWorkflowError,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.engine.registry import Registry
from celery_durable.stores.base import Doc, Op
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("query-tests", set_as_current=False)
durable = Durable(app, store="memory://")


class FrozenStore(MemoryStore):
    """A memory store that fails the test on any write while ``frozen``."""

    frozen = False

    def _refuse(self, what: str) -> None:
        if self.frozen:
            raise AssertionError(f"a query wrote to the store: {what}")

    def create(self, doc: Doc) -> str | None:
        self._refuse(f"create {doc.get('id')}")
        return super().create(doc)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        self._refuse(f"replace {doc.get('id')}")
        return super().replace(doc, if_match)

    def upsert(self, doc: Doc) -> str:
        self._refuse(f"upsert {doc.get('id')}")
        return super().upsert(doc)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        self._refuse(f"delete {doc_id}")
        return super().delete(pk, doc_id, if_match)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._refuse(f"batch {[op.doc_id for op in ops]}")
        return super().batch(pk, ops)


class Progress(BaseModel):
    stage: str
    charged: int


@durable_activity(name="q.charge")
def charge(cents: int) -> int:
    return cents


@durable.workflow(name="q.order", signals={"ship": str})
def order(cents: int) -> str:
    state = {"stage": "new", "charged": 0, "log": []}

    @wf.query("progress")
    def progress() -> Progress:
        return Progress(stage=str(state["stage"]), charged=int(state["charged"]))  # type: ignore[call-overload]

    def log(last: int = 1) -> list[str]:
        return list(state["log"])[-last:]  # type: ignore[call-overload]

    wf.set_query_handler("log", log)

    @wf.query
    def broken() -> int:
        raise KeyError("no such field")

    @wf.query
    def sneaky() -> str:
        return str(wf.now())  # a durable call: refused in a query

    wf.set_status({"stage": "charging"})
    state["charged"] = charge(cents)
    state["stage"] = "charged"
    state["log"].append("charged")  # type: ignore[attr-defined]
    wf.set_status({"stage": "waiting for shipping"})
    carrier = wf.wait_signal("ship")
    state["stage"] = f"shipped by {carrier}"
    state["log"].append(carrier)  # type: ignore[attr-defined]
    wf.set_status({"stage": "done"})
    return carrier


@durable.workflow(name="q.loop")
def loop(n: int, seen: int = 0) -> int:
    wf.set_query_handler("seen", lambda: seen)
    if n == 0:
        return seen
    charge(n)
    wf.continue_as_new(n - 1, seen + 1)
    return -1


@durable.workflow(name="q.bad_status")
def bad_status() -> str:
    wf.set_status({1, 2})  # a set: JSON cannot carry it
    return "unreachable"


def _env() -> tuple[WorkflowEnvironment, FrozenStore]:
    store = FrozenStore()
    return WorkflowEnvironment(durable, store=store), store


def _frozen_query(env: WorkflowEnvironment, store: FrozenStore, handle: Any, name: str, *args: Any) -> Any:
    """``handle.query`` with every store write failing the test and no message sent."""
    before = {d["id"]: d["_etag"] for d in store.query_partition(handle.id).docs}
    queued = len(env.dispatcher.queue)
    store.frozen = True
    try:
        return handle.query(name, *args)
    finally:
        store.frozen = False
        assert len(env.dispatcher.queue) == queued, "a query sent something"
        assert {d["id"]: d["_etag"] for d in store.query_partition(handle.id).docs} == before


def test_a_query_reads_the_state_of_a_suspended_workflow_and_writes_nothing() -> None:
    env, store = _env()
    h = env.start(order, 250)
    assert h.status() == "running"
    answer = _frozen_query(env, store, h, "progress")
    assert answer == Progress(stage="charged", charged=250)  # typed by the handler's return hint
    assert _frozen_query(env, store, h, "log", 5) == ["charged"]
    assert h.poll().custom_status == {"stage": "waiting for shipping"}
    env.signal(h, "ship", "ups")
    assert env.result(h) == "ups"
    # a finished execution still answers, from its full history
    assert _frozen_query(env, store, h, "progress") == Progress(stage="shipped by ups", charged=250)
    assert _frozen_query(env, store, h, "log", 2) == ["charged", "ups"]
    assert h.poll().custom_status == {"stage": "done"}


def test_the_frozen_store_catches_a_write() -> None:
    """The harness can fail: what a drive does (a commit) is refused while frozen."""
    env, store = _env()
    h = env.start(order, 100)
    store.frozen = True
    with pytest.raises(AssertionError, match="a query wrote to the store"):
        env.engine.signal(h.id, "ship", "ups")


def test_query_failures_are_clear() -> None:
    env, store = _env()
    h = env.start(order, 100)
    with pytest.raises(UnknownQueryError) as unknown:
        _frozen_query(env, store, h, "nope")
    assert unknown.value.registered == ["broken", "log", "progress", "sneaky"]
    assert "'broken', 'log', 'progress', 'sneaky'" in str(unknown.value)
    with pytest.raises(QueryFailedError) as failed:
        _frozen_query(env, store, h, "broken")
    assert failed.value.type_name == "KeyError" and isinstance(failed.value.__cause__, KeyError)
    with pytest.raises(QueryFailedError, match="cannot make a durable call .*queries only read"):
        _frozen_query(env, store, h, "sneaky")
    with pytest.raises(PayloadValidationError, match="last"):  # checked against the handler's hints
        _frozen_query(env, store, h, "log", "many")
    with pytest.raises(PayloadValidationError, match="bad arguments"):
        _frozen_query(env, store, h, "progress", 1, 2)
    with pytest.raises(UnknownWorkflowError, match="never started, or purged"):
        env.handle("no-such-id").query("progress")


def test_a_caller_without_the_workflow_registered_is_told_to_import_it() -> None:
    env, _ = _env()
    h = env.start(order, 100)
    elsewhere = WorkflowEnvironment(Registry(), store=env.store)
    with pytest.raises(UnknownWorkflowError, match="not registered in this process.*import the module"):
        elsewhere.handle(h.id).query("progress")


def test_a_pruned_history_is_reported_not_replayed_from_nothing() -> None:
    env, store = _env()
    h = env.start(order, 100)
    env.signal(h, "ship", "dhl")
    assert env.result(h) == "dhl"
    for doc in store.query_partition(h.id).docs:  # what a history retention would do
        if doc["id"] != "exec":
            store.delete(h.id, doc["id"])
    with pytest.raises(HistoryUnavailableError, match="incomplete"):
        h.query("progress")
    assert h.poll().custom_status == {"stage": "done"}  # the exec still tells its status
    store.delete(h.id, "exec")  # purged
    with pytest.raises(UnknownWorkflowError, match="purged"):
        h.query("progress")


def test_a_query_after_continue_as_new_reads_the_current_run() -> None:
    env, store = _env()
    h = env.start(loop, 3)
    assert env.result(h) == 3
    assert _frozen_query(env, store, h, "seen") == 3
    assert int(h.poll().steps) == 0  # run 3 took no step: the old runs are pruned


def test_custom_status_that_json_cannot_carry_fails_the_workflow_clearly() -> None:
    env, _ = _env()
    h = env.start(bad_status)
    info = h.poll()
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "PayloadValidationError" and "custom status" in info.error["message"]
    assert info.custom_status is None


def test_custom_status_is_written_only_when_it_changed() -> None:
    env, store = _env()
    h = env.start(order, 100)
    exec_before = store.read(h.id, "exec")
    assert exec_before is not None and exec_before["custom_status"] == {"stage": "waiting for shipping"}
    # a duplicate drive recomputes the same status: nothing to commit
    assert env.engine.drive(h.id) == "noop"
    exec_after = store.read(h.id, "exec")
    assert exec_after is not None and exec_after["_etag"] == exec_before["_etag"]


def test_durable_show_shows_the_custom_status_and_patch_steps() -> None:
    import json
    import time

    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    from tests.apps import basic

    store = MemoryStore()
    now = time.time()
    status = {"stage": "packing", "n": 3}
    store.create({"pk": "shown", "id": "exec", "type": "exec", "workflow": "w", "status": "running", "steps": 1,
                  "run": 0, "created_at": now, "updated_at": now, "custom_status": status})  # fmt: skip
    store.create({"pk": "shown", "id": "s:000001", "type": "step", "run": 0, "seq": 1, "kind": "patch",
                  "name": "add-audit", "value": True, "created_at": now})  # fmt: skip
    basic.durable.configure(store=store)
    try:
        text = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "show", "shown"])
        as_json = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "show", "shown", "--json"])
    finally:
        basic.durable.configure(store=None)
    assert text.exit_code == 0, text.output
    assert 'custom     {"stage": "packing", "n": 3}' in text.output
    assert "patch" in text.output and "add-audit" in text.output and "recorded" in text.output
    assert json.loads(as_json.output)["custom_status"] == {"stage": "packing", "n": 3}
