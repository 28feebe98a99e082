"""Limits on workflows (issue 26 §1, engine/limits/workflows.py): an execution started under a
limit is created ``queued`` and starts when it gets a slot of its key, which it holds until it
ends; priority first, then arrival; a queued execution cancelled ends at once and leaves the queue."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import Limit
from celery_durable import workflow as wf
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import WorkflowQueueing, limit_pk
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.starts.deadlines import Timing
from celery_durable.errors import ConfigurationError
from tests.engine.inprocess import InProcess


def _world(limit: Limit | None) -> tuple[InProcess, Any]:
    w = InProcess()

    def tenant_job(tenant: str, n: int) -> str:
        got = wf.wait_signal("go")
        return f"{tenant}:{n}:{got}"

    definition = w.registry.add_workflow("tenant_job", tenant_job, None, limit)
    return w, definition


def _start(w: InProcess, definition: Any, eid: str, *args: Any, **opts: Any) -> str:
    q = WorkflowQueueing(**opts) if opts else None
    w.engine.start(definition, args, {}, workflow_id=eid, queueing=q)
    w.run()
    return eid


def _doc(w: InProcess, name: str, key: str) -> dict[str, Any]:
    doc = w.store.read(limit_pk({"name": name, "key": key}), LIMIT_DOC_ID)
    assert doc is not None
    return doc


def _statuses(w: InProcess, ids: list[str]) -> list[str]:
    return [w.status(e) for e in ids]


def _finish(w: InProcess, eid: str) -> None:
    w.engine.signal(eid, "go", "ok")
    w.run()


def test_at_most_max_running_per_key_and_the_next_starts_when_one_ends() -> None:
    w, d = _world(Limit("tenants", max_running=2, key=lambda tenant, n: tenant))
    a = [_start(w, d, f"a{i}", "a", i) for i in range(4)]
    b = _start(w, d, "b0", "b", 0)
    assert _statuses(w, a) == ["running", "running", "queued", "queued"]
    assert w.status(b) == "running"  # keys are independent
    doc = _doc(w, "tenants", "a")
    assert sorted(doc["holders"]) == ["a0|wf", "a1|wf"] and [x["e"] for x in doc["waiters"]] == ["a2", "a3"]
    # a queued execution was never driven: no code of it ran, no replay recorded a step
    assert w.ex("a2").get("steps") in (None, 0)
    _finish(w, "a0")
    assert _statuses(w, a) == ["completed", "running", "running", "queued"]
    assert sorted(_doc(w, "tenants", "a")["holders"]) == ["a1|wf", "a2|wf"]
    for e in ("a1", "a2", "a3"):
        _finish(w, e)
    assert _statuses(w, a) == ["completed"] * 4
    assert w.engine.read_exec("a3")["result"] == "a:3:ok"
    doc = _doc(w, "tenants", "a")
    assert doc["holders"] == {} and doc["waiters"] == []


def test_priority_then_arrival() -> None:
    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "first", "t", 0)
    for eid, p in (("low", 5), ("high", 1), ("mid", 3), ("high2", 1)):
        _start(w, d, eid, "t", 0, priority=p)
    order = []
    for _ in range(5):
        running = [e for e in ("first", "low", "high", "mid", "high2") if w.status(e) == "running"]
        assert len(running) == 1
        order.append(running[0])
        _finish(w, running[0])
    assert order == ["first", "high", "high2", "mid", "low"]


def test_a_queued_execution_cancelled_ends_at_once_and_leaves_the_queue() -> None:
    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "x", "t", 0)
    _start(w, d, "y", "t", 0)
    _start(w, d, "z", "t", 0)
    assert w.engine.cancel("y")
    assert w.status("y") == "cancelled"
    assert [x["e"] for x in _doc(w, "one", "")["waiters"]] == ["z"]
    _finish(w, "x")
    assert w.status("z") == "running"


def test_a_terminated_holder_frees_its_slot() -> None:
    from celery_durable.engine.admin.terminate import terminate

    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "x", "t", 0)
    _start(w, d, "y", "t", 0)
    terminate(w.engine, "x", "ops", None)
    w.run()
    assert w.status("y") == "running"


def test_options_key_and_limit_override_the_declaration() -> None:
    w, d = _world(None)
    lim = Limit("adhoc", max_running=1)
    _start(w, d, "p", "t", 0, limit=lim, key="acme")
    _start(w, d, "q", "t", 1, limit=lim, key="acme")
    _start(w, d, "r", "t", 2, limit=lim, key="other")
    _start(w, d, "s", "t", 3)  # not limited
    assert _statuses(w, ["p", "q", "r", "s"]) == ["running", "queued", "running", "running"]
    with pytest.raises(ConfigurationError, match="need a limit"):
        w.engine.start(d, ("t", 4), {}, workflow_id="u", queueing=WorkflowQueueing(priority=1))


def test_a_bad_key_fails_in_the_caller_and_stores_nothing() -> None:
    w, d = _world(Limit("bad", max_running=1, key=lambda tenant, n: None))
    with pytest.raises(ConfigurationError, match="bad"):
        w.engine.start(d, ("t", 0), {}, workflow_id="v")
    assert w.store.read("v", "exec") is None


def test_a_starter_killed_between_its_writes_is_made_up_by_recovery() -> None:
    """The execution was created ``queued`` but never joined its limit (its starter died): its
    recovery due makes a drive take its turn, which queues it, and it starts."""
    w, d = _world(Limit("one", max_running=1))
    w.engine.limits.queue_execution = lambda eid, record: None  # type: ignore[method-assign]
    _start(w, d, "lost", "t", 0)
    del w.engine.limits.queue_execution
    assert w.status("lost") == "queued"
    w.clock.advance(w.engine.settings.drive_timeout + 1)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    w.run()
    assert w.status("lost") == "running"


def test_a_lost_release_is_freed_by_the_scan_after_the_holder_expires() -> None:
    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "x", "t", 0)
    _start(w, d, "y", "t", 0)
    release = w.engine.limits.release_execution
    w.engine.limits.release_execution = lambda ex: None  # type: ignore[method-assign]
    _finish(w, "x")
    w.engine.limits.release_execution = release  # type: ignore[method-assign]
    assert w.status("x") == "completed" and w.status("y") == "queued"
    w.clock.advance(w.engine.settings.lease_ttl + 1)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    w.run()
    assert w.status("y") == "running"


def test_the_timeout_counts_from_the_start_not_the_queueing() -> None:
    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "x", "t", 0)
    w.engine.start(d, ("t", 1), {}, workflow_id="y", timing=Timing(timeout=100.0))
    w.run()
    w.clock.advance(500)  # type: ignore[attr-defined]
    w.engine.timers.fire_due_clocks()
    w.run()
    assert w.status("y") == "queued"  # not timed out while it waited
    _finish(w, "x")
    assert w.status("y") == "running"
    assert w.ex("y")["deadline_at"] == pytest.approx(w.clock.now() + 100.0)
    w.clock.advance(101)  # type: ignore[attr-defined]
    w.engine.timers.fire_due_clocks()
    w.run()
    assert w.status("y") == "timed_out"


def test_a_delayed_start_queues_at_its_time() -> None:
    w, d = _world(Limit("one", max_running=1))
    _start(w, d, "x", "t", 0)
    w.engine.start(d, ("t", 1), {}, workflow_id="later", timing=Timing(start_delay=60.0))
    assert w.status("later") == "scheduled"
    w.clock.advance(61)  # type: ignore[attr-defined]
    w.engine.timers.fire_due_clocks()
    w.run()
    assert w.status("later") == "queued"
    _finish(w, "x")
    assert w.status("later") == "running"


def test_continue_as_new_keeps_the_slot() -> None:
    w = InProcess()

    def looping(n: int) -> int:
        if n < 2:
            wf.continue_as_new(n + 1)
        return int(wf.wait_signal("go"))

    d = w.registry.add_workflow("looping", looping, None, Limit("loop", max_running=1))
    w.engine.start(d, (0,), {}, workflow_id="l1")
    w.run()
    w.engine.start(d, (0,), {}, workflow_id="l2")
    w.run()
    assert w.status("l1") == "running" and w.status("l2") == "queued"
    assert list(_doc(w, "loop", "")["holders"]) == ["l1|wf"]
    w.engine.signal("l1", "go", 7)
    w.run()
    assert w.status("l1") == "completed" and w.status("l2") == "running"


def test_children_of_a_limited_workflow_wait_their_turn_and_take_turns_between_parents() -> None:
    w = InProcess()

    def child(n: int) -> int:
        return int(wf.wait_signal("go")) + n

    cdef = w.registry.add_workflow("child", child, None, Limit("kids", max_running=1))

    def parent(count: int) -> list[int]:
        ctx = require_context("parent")
        futures = [ctx.start_child(cdef, (i,), {}, None) for i in range(count)]
        return [f.result() for f in futures]

    pdef = w.registry.add_workflow("parent", parent)
    w.engine.start(pdef, (3,), {}, workflow_id="p1")
    w.run()
    w.engine.start(pdef, (1,), {}, workflow_id="p2")
    w.run()
    doc = _doc(w, "kids", "")
    assert len(doc["holders"]) == 1 and len(doc["waiters"]) == 3
    started: list[str] = []
    for _ in range(4):
        (holder,) = doc["holders"]
        eid = holder.removesuffix("|wf")
        assert w.status(eid) == "running"
        started.append(str(w.ex(eid)["parent"]["pk"]))
        w.engine.signal(eid, "go", 10)
        w.run()
        doc = _doc(w, "kids", "")
        if not doc["holders"]:
            break
    # p1's first child, then p2's (its turn: p1 was served last), then p1's other two
    assert started == ["p1", "p2", "p1", "p1"]
    assert w.status("p1") == "completed" and w.ex("p1")["result"] == [10, 11, 12]
    assert w.status("p2") == "completed"


def test_through_the_app_api_declared_limit_and_options() -> None:
    from celery import Celery

    from celery_durable import Durable
    from celery_durable.testing.env import WorkflowEnvironment

    durable = Durable(Celery("wf-limits-api", set_as_current=False), store="memory://")

    @durable.workflow(limit=Limit("api-tenant", max_running=1, key=lambda tenant: tenant))
    def job(tenant: str) -> str:
        return str(wf.wait_signal("go")) + tenant

    env = WorkflowEnvironment(durable)
    a = env.start(job, "acme")
    b = env.start(job, "acme")
    c = env.start(job.options(limit_key="other"), "acme")
    d = env.start(job.options(priority=-1), "acme")
    assert [h.status() for h in (a, b, c, d)] == ["running", "queued", "running", "queued"]
    a.signal("go", "x")
    env.run_until_idle()
    assert [h.status() for h in (a, b, d)] == ["completed", "queued", "running"]
    with pytest.raises(ConfigurationError, match="top-level"):
        job.options(priority=1).start_child("acme")
