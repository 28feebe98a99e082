"""The operators' read model and operations (celery_durable.engine.admin.operator), on an in-process engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.engine import Engine
from celery_durable.engine.admin.operator import Admin, OperationRefused, PurgeReport
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.errors import ActivityError, UnknownWorkflowError, WorkflowCancelledError
from celery_durable.stores import Store, store_from_url
from tests.engine.inprocess import InProcess

DAY = 86400.0


class Env(InProcess):
    def __init__(self, store: Store | None = None) -> None:
        super().__init__(store, step_time=1.0)  # every stage at its own time, as on real workers
        self.admin = Admin(self.engine)
        self.ran: list[str] = []


@pytest.fixture
def env() -> Env:
    return Env()


def _flaky(env: Env, flag: dict[str, bool]) -> tuple[Any, Any]:
    @env.activity
    def step(x: int) -> int:
        env.ran.append(f"step{x}")
        if x == 2 and not flag.get("fixed"):
            raise RuntimeError("flag is missing")
        return x

    @env.workflow
    def three() -> int:
        return step(1) + step(2) + step(3)

    return step, three


# --- reads ---------------------------------------------------------------------------------------


def test_executions_are_paged_newest_first_with_one_query_per_page(env: Env) -> None:
    @env.workflow
    def noop(n: int) -> int:
        return n

    @env.workflow
    def other(n: int) -> int:
        raise ValueError("no")

    ids = [env.start(noop, i) for i in range(5)] + [env.start(other, 9)]
    env.store.calls.clear()  # type: ignore[attr-defined]
    seen, cursor, pages = [], None, 0
    while True:
        page = env.admin.executions(limit=2, cursor=cursor)
        seen += [s.id for s in page.executions]
        pages += 1
        if (cursor := page.cursor) is None:
            break
    assert seen == ids[::-1] and pages == 3
    assert env.store.calls == {"list_execs": 3}  # type: ignore[attr-defined]  # no read per execution
    assert [s.id for s in env.admin.executions(workflow="other").executions] == [ids[-1]]
    assert {s.id for s in env.admin.executions(status="completed").executions} == set(ids[:-1])
    first = env.admin.executions(status="failed").executions[0]
    assert (first.workflow, first.status, first.corrupt) == ("other", "failed", None)
    with pytest.raises(OperationRefused, match="unknown status"):
        env.admin.executions(status="finished")


def test_describe_shows_the_timeline(env: Env) -> None:
    @env.activity
    def add(a: int, b: int) -> int:
        return a + b

    @env.workflow
    def kid(n: int) -> int:
        return add(n, n)

    @env.workflow
    def parent(n: int) -> int:
        total = add(n, 1)
        wf.sleep(60)
        got = wf.wait_signal("go")
        return total + env.child(kid, n) + int(got)

    eid = env.start(parent, 2)
    detail = env.admin.describe(eid)
    assert detail.summary.status == "running"
    assert [(s.kind, s.state) for s in detail.steps] == [("activity", "ok"), ("sleep", "waiting")]
    env.clock.advance(61)
    env.engine.timers.fire_due_clocks()
    env.run()
    assert env.engine.signal(eid, "go", 5) is True
    env.run()
    detail = env.admin.describe(eid)
    assert detail.summary.status == "completed" and detail.result == 3 + 4 + 5
    assert [(s.seq, s.kind, s.name, s.state) for s in detail.steps] == [
        (1, "activity", "add", "ok"),
        (2, "sleep", "sleep", "ok"),
        (3, "signal", "go", "ok"),
        (4, "child", "kid", "ok"),
    ]
    assert detail.steps[0].attempts == 1 and detail.steps[0].value == 3 and detail.steps[0].task_id == f"{eid}:1"
    assert detail.steps[3].child_id in detail.children and detail.steps[3].value == 4
    assert [(s.name, s.state, s.value) for s in detail.signals] == [("go", "consumed", 5)]
    assert all(s.finished_at is not None and s.scheduled_at is not None for s in detail.steps)
    with pytest.raises(UnknownWorkflowError):
        env.admin.describe("nope")


def test_a_malformed_document_is_flagged_not_raised(env: Env) -> None:
    @env.activity
    def one() -> int:
        return 1

    @env.workflow
    def flow() -> int:
        return one() + one()

    eid = env.start(flow)
    marker = env.store.read(eid, "s:000002")
    assert marker is not None
    env.store.replace({k: v for k, v in marker.items() if k != "kind"} | {"seq": "two"}, None)
    ex = env.store.read(eid, "exec")
    assert ex is not None
    env.store.replace(ex | {"status": 7}, None)
    detail = env.admin.describe(eid)
    assert {s.seq: s.state for s in detail.steps} == {1: "ok", -1: "corrupt"}  # an unreadable seq shows as -1
    assert any("s:000002" in c for c in detail.corrupt) and "status is not a string" in str(detail.summary.corrupt)
    (listed,) = env.admin.executions().executions
    assert listed.id == eid and listed.corrupt


def test_sqlite_corrupt_documents_are_flagged_in_list_and_describe(tmp_path: Path) -> None:
    import sqlite3

    env = Env(store_from_url(f"sqlite:///{tmp_path / 's.db'}"))

    @env.workflow
    def noop(n: int) -> int:
        return n

    good, bad = env.start(noop, 1), env.start(noop, 2)
    with sqlite3.connect(tmp_path / "s.db") as raw:
        raw.execute("UPDATE docs SET body = '{oops' WHERE pk = ? AND id = 'exec'", (bad,))
    listed = {s.id: s for s in env.admin.executions().executions}
    assert listed[good].corrupt is None and listed[good].status == "completed"
    assert "not valid JSON" in str(listed[bad].corrupt)
    detail = env.admin.describe(bad)
    assert detail.summary.corrupt and detail.corrupt
    assert env.admin.purge(0).purged == 1  # the readable one; the corrupt one is left for inspection
    assert [s.id for s in env.admin.executions().executions] == [bad]


# --- retry / resume ------------------------------------------------------------------------------------


def test_retry_reruns_only_the_failed_step_and_bumps_the_generation(env: Env) -> None:
    flag: dict[str, bool] = {}
    _, three = _flaky(env, flag)
    eid = env.start(three)
    assert env.status(eid) == "failed"
    with pytest.raises(OperationRefused, match="completed, not failed"):
        env.admin.retry(env.start(_ok(env)))
    generation = int(env.engine.read_exec(eid).get("generation") or 0)
    flag["fixed"] = True
    rerun = env.admin.retry(eid)
    assert [(s.seq, s.name) for s in rerun] == [(2, "step")]
    assert int(env.engine.read_exec(eid)["generation"]) == generation + 1
    assert env.status(eid) == "running"
    env.run()
    ex = env.engine.read_exec(eid)
    assert (ex["status"], ex["result"], ex["retried"]) == ("completed", 6, 1)
    assert env.ran == ["step1", "step2", "step2", "step3"]  # step 1 not again


def _ok(env: Env) -> Any:
    @env.workflow
    def fine() -> int:
        return 1

    return fine


def test_retry_is_seen_by_another_worker_with_a_warm_cache(env: Env) -> None:
    """Bug 3 of issue 10: a per-process cache that never saw the deletion skipped the re-run."""
    flag: dict[str, bool] = {}
    _, three = _flaky(env, flag)
    eid = env.start(three)
    other = Engine(env.store, env.dispatcher, env.registry, clock=env.clock)  # a second worker
    other.cache.load(eid)  # its cache holds the failed result
    worker = LocalWorker(other, env.dispatcher)
    flag["fixed"] = True
    env.admin.retry(eid)
    env.clock.advance(1)
    worker.run()  # the other worker gets the activity and the drives
    assert other.read_exec(eid)["status"] == "completed"


def test_retry_of_a_failed_child_retries_the_child(env: Env) -> None:
    flag: dict[str, bool] = {}
    _, three = _flaky(env, flag)

    @env.workflow
    def parent() -> int:
        return env.child(three) * 10

    eid = env.start(parent)
    assert env.status(eid) == "failed"
    (child,) = env.admin.describe(eid).children
    assert env.status(child) == "failed"
    flag["fixed"] = True
    assert [s.kind for s in env.admin.retry(eid)] == ["child"]
    env.run()
    assert (env.status(child), env.engine.read_exec(eid)["result"]) == ("completed", 60)


def test_retry_without_a_failed_step_redrives_the_fixed_code(env: Env) -> None:
    calls: list[int] = []
    broken = {"yes": True}

    @env.activity
    def fetch() -> int:
        calls.append(1)
        return 4

    @env.workflow
    def flow() -> int:
        n = fetch()
        if broken["yes"]:
            raise ValueError("bug in the workflow")
        return n * 2

    eid = env.start(flow)
    assert env.status(eid) == "failed"
    broken["yes"] = False  # "deploy" the fix
    assert env.admin.retry(eid) == []
    env.run()
    assert env.engine.read_exec(eid)["result"] == 8 and calls == [1]


def test_resume_a_failed_execution_keeps_its_results(env: Env) -> None:
    broken = {"yes": True}

    @env.activity
    def fails() -> int:
        env.ran.append("fails")
        raise RuntimeError("down")

    @env.workflow
    def flow() -> str:
        try:
            fails()
        except ActivityError:
            if broken["yes"]:
                raise
        return "handled"

    eid = env.start(flow)
    assert env.status(eid) == "failed"
    broken["yes"] = False
    assert env.admin.resume(eid) == []
    env.run()
    assert env.engine.read_exec(eid)["result"] == "handled" and env.ran == ["fails"]  # not re-run


def test_resume_a_cancelled_execution_withdraws_the_cancel(env: Env) -> None:
    @env.activity
    def act(what: str) -> str:
        env.ran.append(what)
        return what

    @env.workflow
    def flow() -> str:
        act("before")
        try:
            wf.sleep(3600)
        except WorkflowCancelledError:
            act("compensate")
            raise
        return act("after")

    eid = env.start(flow)
    assert env.engine.cancel(eid) is True
    env.run()
    assert env.status(eid) == "cancelled" and env.ran == ["before", "compensate"]
    generation = int(env.engine.read_exec(eid).get("generation") or 0)
    assert [s.kind for s in env.admin.resume(eid)] == ["sleep"]  # the interrupted step, armed again
    env.run()
    ex = env.engine.read_exec(eid)
    assert (ex["status"], ex["cancel_requested"], int(ex["generation"])) == ("running", False, generation + 1)
    assert [(s.kind, s.state) for s in env.admin.describe(eid).steps] == [("activity", "ok"), ("sleep", "waiting")]
    env.clock.advance(3600)
    assert env.engine.timers.fire_due_clocks() == 1  # the timer is due again (beat's scan finds it)
    env.run()
    assert env.engine.read_exec(eid)["result"] == "after"
    assert env.ran == ["before", "compensate", "after"]  # "before" not again; the compensation is forgotten


def test_resume_refuses_a_completed_execution_and_wakes_a_running_one(env: Env) -> None:
    @env.workflow
    def waits() -> Any:
        return wf.wait_signal("x")

    done = env.start(_ok(env))
    with pytest.raises(OperationRefused, match="completed"):
        env.admin.resume(done)
    eid = env.start(waits)
    sent = len(env.dispatcher.sent)
    assert env.admin.resume(eid) == []
    assert ("drive", eid) in env.dispatcher.sent[sent:]


# --- purge ---------------------------------------------------------------------------------------


def test_purge_deletes_old_terminal_executions_in_batches(env: Env) -> None:
    @env.activity
    def tick(i: int) -> int:
        return i

    @env.workflow
    def many(n: int) -> int:
        return sum(tick(i) for i in range(n))

    @env.workflow
    def waits() -> Any:
        return wf.wait_signal("x")

    big = env.start(many, 120)  # 241 documents: three batches of its partition
    small = env.start(many, 1)
    running = env.start(waits)
    env.clock.advance(10 * DAY)
    young = env.start(many, 2)
    assert env.admin.purge(5 * DAY, dry_run=True) == PurgeReport(matched=2, dry_run=True)
    seen: list[PurgeReport] = []
    env.store.calls.clear()  # type: ignore[attr-defined]
    report = env.admin.purge(5 * DAY, progress=seen.append)
    assert (report.matched, report.purged, report.documents, report.skipped) == (2, 2, 241 + 3, 0)
    assert [r.purged for r in seen] == [1, 2]
    assert env.store.calls["batch"] == 3 + 1 and "delete" not in env.store.calls  # type: ignore[attr-defined]
    for pk, n in ((big, 241), (small, 3)):  # all gone but the purge's own record (engine/admin/oplog.py)
        (gone,) = env.store.query_partition(pk).docs
        assert (gone["id"], gone["action"], gone["status"], gone["documents"]) == ("purged", "purge", "completed", n)
        with pytest.raises(UnknownWorkflowError, match="purged by .*@"):
            env.admin.describe(pk)
    assert {s.id for s in env.admin.executions().executions} == {running, young}


def test_purge_keeps_a_child_whose_parent_was_not_told(env: Env) -> None:
    @env.workflow
    def kid() -> int:
        return 1

    @env.workflow
    def parent() -> int:
        return int(env.child(kid))

    eid = env.start(parent)
    (child,) = env.admin.describe(eid).children
    ex = env.store.read(child, "exec")
    assert ex is not None
    env.store.replace(ex | {"parent_notified": False}, None)  # its notice is still due
    env.clock.advance(DAY)
    report = env.admin.purge(0)
    assert (report.matched, report.purged, report.skipped) == (2, 1, 1)
    assert env.status(child) == "completed"
    with pytest.raises(OperationRefused, match=">= 0"):
        env.admin.purge(-1)
