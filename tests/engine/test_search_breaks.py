"""Adversarial review of search attributes and memo (issue 13 item 5), engine side: the caps hold
for what ``wf.upsert_search`` adds, not only for each call."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.stores import store_from_url
from celery_durable.stores.search import MAX_ATTRS
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-search-tests", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow
def many_upserts(calls: int) -> int:
    for i in range(calls):  # each call within the caps, together far over them
        wf.upsert_search(**{f"k{i}_{j}": "x" * 200 for j in range(10)})
    return calls


def test_upserts_together_cannot_pass_the_caps() -> None:
    """Ten upserts of ten 200-character attributes each: 100 attributes (~23 KB) were stored,
    past the documented 32 attributes / 16 KB, because each call was checked alone."""
    env = WorkflowEnvironment(durable)
    info = env.start(many_upserts, 10).poll()
    assert len(info.search or {}) <= MAX_ATTRS, len(info.search or {})
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "InvalidSearchAttribute"


state = {"pick": "a", "boom": True}


@durable_activity(name="advs.pick")
def pick() -> str:
    return state["pick"]


@durable_activity(name="advs.boom")
def boom() -> None:
    if state["boom"]:
        raise ValueError("boom")


@durable.workflow(name="advs.tagged")
def tagged() -> str:
    p = pick()
    if p == "a":
        wf.upsert_search(route="a")
    boom()
    return p


def test_a_reset_run_recomputes_the_attributes_from_its_own_history() -> None:
    """Reset from step 1 re-runs ``pick``, which now takes the other branch: the re-run never
    upserts ``route``, yet the execution stayed listed under ``route="a"`` (merged onto the old
    run's attributes, not recomputed)."""
    state.update(pick="a", boom=True)
    env = WorkflowEnvironment(durable)
    h = env.start(tagged, _search={"customer": "c-1"})
    assert h.poll().status == "failed" and h.poll().search == {"customer": "c-1", "route": "a"}
    state.update(pick="b", boom=False)
    h.reset(step=1)
    env.run_until_idle()
    assert env.result(h) == "b"
    assert h.poll().search == {"customer": "c-1"}
    assert list(env.list_executions(search={"route": "a"}).executions) == []


@durable.workflow(name="advs.floaty", signals={"go": str})
def floaty() -> str:
    wf.upsert_search(score=3.0, zero=-0.0)
    return wf.wait_signal("go")


@pytest.mark.cosmos
def test_a_replayed_drive_writes_nothing_on_cosmos(cosmos_url: str) -> None:
    """Cosmos gives 3.0 back as 3 and -0.0 as 0: every replayed drive saw its upsert as a change
    and rewrote the exec (and its index entries), where the other stores write nothing."""
    store = store_from_url(cosmos_url)
    try:
        env = WorkflowEnvironment(durable, store=store)
        h = env.start(floaty, _workflow_id="f")
        before = store.read("f", "exec")
        assert before is not None and before["search"] == {"score": 3, "zero": 0}
        env.engine.driver.drive("f")  # a duplicate drive
        after = store.read("f", "exec")
        assert after is not None and after["_etag"] == before["_etag"]
        assert h.poll().status == "running"
    finally:
        store.close()
