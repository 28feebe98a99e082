"""Search attributes and memo (issue 13, item 5): set at start, updated by ``wf.upsert_search``
(recorded with the drive's commit, deterministic under replay), listed by ``Admin.executions``
(``durable.list_executions``); the memo is shown, never searched."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, InvalidSearchAttribute
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("search-tests", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(signals={"go": str})
def order(customer: str) -> str:
    wf.upsert_search(stage="waiting", tags=["new"])
    how = wf.wait_signal("go")
    wf.upsert_search(stage=how, tags=None, paid=True)
    return how


@durable.workflow
def rounds(n: int) -> int:
    wf.upsert_search(round=n)
    if n < 2:
        wf.continue_as_new(n + 1)
    return n


@durable.workflow
def parent_with_options() -> None:
    rounds.options(search={"a": 1}).start_child(0).result()


@durable.workflow
def bad_upsert() -> None:
    wf.upsert_search(**{"x": {"not": "allowed"}})


def _ids(env: WorkflowEnvironment, **search: Any) -> list[str]:
    return [e.id for e in Admin(env.engine).executions(search=search).executions]


def test_start_attributes_upserts_and_listing() -> None:
    env = WorkflowEnvironment(durable)
    a = env.start(order, "c-42", _workflow_id="a", _search={"customer": "c-42", "priority": 3}, _memo={"note": "hi"})
    env.clock.advance(1)
    b = env.start(order, "c-7", _workflow_id="b", _search={"customer": "c-7", "priority": 3})
    info = a.poll()
    assert info.search == {"customer": "c-42", "priority": 3, "stage": "waiting", "tags": ["new"]}
    assert info.memo == {"note": "hi"}
    assert _ids(env, customer="c-42") == ["a"]
    assert _ids(env, priority=3) == ["b", "a"]
    assert _ids(env, tags="new") == ["b", "a"]
    assert _ids(env, note="hi") == []  # the memo is not searchable
    env.signal(a, "go", "express")
    assert a.result() == "express"
    assert a.poll().search == {"customer": "c-42", "priority": 3, "stage": "express", "paid": True}
    assert _ids(env, tags="new") == ["b"]
    assert _ids(env, stage="express", paid=True) == ["a"]
    assert b.poll().memo is None
    page = durable.admin.__class__(env.engine).executions(status="completed", search={"customer": "c-42"})
    assert [e.id for e in page.executions] == ["a"] and page.executions[0].memo == {"note": "hi"}


def test_a_replayed_drive_writes_the_same_attributes() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(order, "c-1", _workflow_id="r")
    before = env.store.read("r", "exec")
    assert before is not None
    env.engine.driver.drive("r")  # a duplicate drive: the replay recomputes the same updates
    after = env.store.read("r", "exec")
    assert after is not None and after["search"] == before["search"] == {"stage": "waiting", "tags": ["new"]}
    assert after["_etag"] == before["_etag"]  # nothing changed, nothing written
    assert h.poll().search == {"stage": "waiting", "tags": ["new"]}


def test_continue_as_new_keeps_the_attributes_and_the_memo() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(rounds, 0, _search={"customer": "c-1"}, _memo=["m"])
    assert h.result() == 2
    assert h.poll().search == {"customer": "c-1", "round": 2} and h.poll().memo == ["m"]
    assert env.list_executions(search={"round": 2, "customer": "c-1"}).executions[0].id == h.id


def test_a_child_cannot_be_given_attributes_at_start() -> None:
    env = WorkflowEnvironment(durable)
    info = env.start(parent_with_options).poll()
    assert info.status == "failed" and info.error is not None and "top-level" in info.error["message"]


def test_bad_attributes_are_refused_before_anything_is_stored() -> None:
    env = WorkflowEnvironment(durable)
    with pytest.raises(InvalidSearchAttribute):
        env.start(order, "c", _workflow_id="x", _search={"bad key": 1})
    with pytest.raises(InvalidSearchAttribute):
        env.start(order, "c", _workflow_id="x", _memo={"big": "x" * 40000})
    with pytest.raises(InvalidSearchAttribute):
        order.options(search={"c": object()})
    assert env.store.read("x", "exec") is None
    with pytest.raises(InvalidSearchAttribute):
        Admin(env.engine).executions(search={"tags": ["a", "b"]})


def test_a_bad_upsert_fails_the_workflow_with_a_clear_error() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(bad_upsert)
    info = h.poll()
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "InvalidSearchAttribute"
