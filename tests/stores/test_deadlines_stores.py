"""Issue 26 §4 on every store: a deadline's clock document is due for the timer scan (each store's
due index: SQLite/PostgreSQL columns, Cosmos' due entries), the execution ends ``timed_out`` with
its compensation run; a delayed start is listed and counted ``scheduled`` by the store's status
filter, then runs when its clock fires."""

from __future__ import annotations

from celery import Celery

from celery_durable import Durable, WorkflowTimedOutError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.counts import status_counts
from celery_durable.engine.starts.deadlines import DEADLINE_CLOCK, START_CLOCK
from celery_durable.stores.base import ExecFilter, Store
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("deadline-store-tests", set_as_current=False)
durable = Durable(app, store="memory://")
UNDONE: list[str] = []


@durable_activity(name="dls.undo")
def undo(what: str) -> None:
    UNDONE.append(what)


@durable.workflow(name="dls.hold")
def hold(day: str) -> str:
    with wf.Saga() as saga:
        saga.add(undo, day)
        return str(wf.wait_signal("go", str))


def test_a_deadline_and_a_delayed_start_on_every_store(store: Store) -> None:
    UNDONE.clear()
    env = WorkflowEnvironment(durable, store=store, start=3_000_000.0)
    timed = env.start(hold.options(timeout=120, workflow_id="dls-timed"), "mon")
    later = env.start(hold.options(start_delay=300, workflow_id="dls-later"), "tue")
    due = [(r.pk, r.id, r.due_at) for r in store.scan_due("clock", float("inf"), 10)]
    assert due == [("dls-timed", DEADLINE_CLOCK, 3_000_120.0), ("dls-later", START_CLOCK, 3_000_300.0)]
    scheduled = store.list_execs(ExecFilter(status="scheduled"), 10).docs
    assert [d["pk"] for d in scheduled] == ["dls-later"]
    counts = {c.status: c.count for c in status_counts(store)}
    assert counts["scheduled"] == 1 and counts["running"] == 1

    env.advance(120)
    assert timed.status() == "timed_out" and UNDONE == ["mon"]
    try:
        timed.result(timeout=0)
        raise AssertionError("a timed-out execution returned a result")
    except WorkflowTimedOutError:
        pass
    assert [d["pk"] for d in store.list_execs(ExecFilter(status="timed_out"), 10).docs] == ["dls-timed"]

    env.advance(180)
    assert later.status() == "running"
    assert (store.read("dls-later", START_CLOCK) or {}).get("due_kind") is None
    env.signal(later, "go", "now")
    assert later.result(timeout=0) == "now"
    assert store.scan_due("clock", float("inf"), 10) == []
