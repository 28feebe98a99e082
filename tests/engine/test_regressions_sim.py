"""Regressions found by the deterministic simulation (``harness/sim.py``).

Each test replays, directly against one in-process engine, the interleaving behind a
``KNOWN_BUGS`` trigger of the simulation, and failed on the code before its fix. A store call
that "races" is monkeypatched to run the other party's action in the middle of it (as the
simulation's preemption does) or to raise as a store outage would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import DurableTimeoutError, StoreUnavailable
from celery_durable.stores.base import Doc, Op
from tests.engine.inprocess import parent_and_child
from tests.engine.test_regressions_links import Env

# --- cancel_parent: a child created after its parent was cancelled ------------------------------


def test_a_child_is_never_created_once_its_parent_is_cancelled() -> None:
    """The child's creator checked the parent (running), then the parent was cancelled and driven
    to its end while the create was in flight: the create must not produce a live child."""
    env = Env()
    ran: list[str] = []
    pdef = parent_and_child(env, ran)
    real_create = env.store.create
    seen: list[Any] = []  # the parent's status whenever a child exec is created

    def racing_create(doc: Doc) -> str | None:
        if doc["pk"] == "P-c1" and doc["id"] == "exec":
            if not seen:  # the cancel lands between the creator's checks and its write
                seen.append("cancel")
                env.engine.cancel("P")
                env.engine.drive("P")
            parent = env.store.read("P", "exec")
            etag = real_create(doc)
            if etag is not None:
                seen.append((doc["status"], parent and parent["status"]))
            return etag
        return real_create(doc)

    env.store.create = racing_create  # type: ignore[method-assign]
    eid, _ = env.engine.start(pdef, ("o-1",), {}, workflow_id="P")
    env.worker.run()
    assert env.ex(eid)["status"] == "cancelled"
    # created (if at all) only while the parent ran, or as a cancelled fence of its step
    assert all(s == "cancel" or s[1] == "running" or s[0] == "cancelled" for s in seen), seen
    child = env.store.read("P-c1", "exec")
    assert child is None or (child["status"] == "cancelled" and not child.get("drives")), child
    assert ran == []


def test_a_fence_left_by_a_failed_cancel_drive_is_not_the_childs_outcome() -> None:
    """The cancelling drive fenced the never-created child, then failed before its commit.
    Recovery's child check must not report the fence to the parent as a finished (cancelled)
    child, which failed the parent with ChildWorkflowError: the parent's own drive records
    the step as cancelled."""
    env = Env()
    ran: list[str] = []
    pdef = parent_and_child(env, ran)
    real_start = env.engine.children.start_child
    env.engine.children.start_child = lambda req: False  # type: ignore[method-assign,assignment,return-value]
    eid = env.start(pdef, "o-2", wid="P")  # the worker died before creating the child
    env.engine.children.start_child = real_start  # type: ignore[method-assign]
    real_batch = env.store.batch
    failed: list[bool] = []

    def batch_(pk: str, ops: Sequence[Op]) -> list[str | None]:
        if pk == "P" and not failed and any(op.doc is not None and op.doc.get("cancelled") for op in ops):
            failed.append(True)
            raise StoreUnavailable("injected: the cancel's commit failed")
        return real_batch(pk, ops)

    env.store.batch = batch_  # type: ignore[method-assign]
    assert env.engine.cancel(eid) is True
    with pytest.raises(StoreUnavailable):
        env.worker.run()
    fence = env.store.read("P-c1", "exec")
    assert failed and fence is not None and fence.get("fence")
    for _ in range(3):
        env.clock.t += 400  # past the child step's deadline: recovery checks it
        env.engine.recovery.scan()
        env.worker.run()
    assert env.ex(eid)["status"] == "cancelled", env.ex(eid)
    assert ran == []


@pytest.mark.parametrize("later", [1.0, 0.0], ids=["step-rearmed", "step-taken-again"])
def test_resuming_a_cancelled_parent_runs_its_fenced_child(later: float) -> None:
    """Resuming a cancelled parent resumes its cancelled children, a fence included: it then runs
    as the real child and its parent is told its outcome. (With the cancel at the step's own
    time, the resume forgets the step and the replay takes it again: its creator finds the
    fence and starts it.)"""
    env = Env()
    ran: list[str] = []
    pdef = parent_and_child(env, ran)
    real_start = env.engine.children.start_child
    env.engine.children.start_child = lambda req: False  # type: ignore[method-assign,assignment,return-value]
    eid = env.start(pdef, "o-3", wid="P")  # the worker died before creating the child
    env.engine.children.start_child = real_start  # type: ignore[method-assign]
    env.clock.t += later
    assert env.engine.cancel(eid) is True
    env.worker.run()
    fence = env.store.read("P-c1", "exec")
    assert env.ex(eid)["status"] == "cancelled" and fence is not None and fence.get("fence")
    Admin(env.engine).resume(eid)
    env.worker.run()
    for _ in range(3):
        env.clock.t += 400
        env.engine.recovery.scan()
        env.worker.run()
    assert ran == ["o-3"]
    assert env.ex(eid)["status"] == "completed", env.ex(eid)


# --- record_before_claim: a contended drive's outcome recorded apart from the exec --------------


def test_a_contended_drive_that_fails_to_claim_leaves_its_step_recoverable() -> None:
    """Under contention a drive takes the exec lease. It used to record the activity's outcome and
    settle the step's marker first, then claim: a store error in between left an outcome that no
    exec write had announced, so a drive holding an older copy of the partition (the inline
    continuation of the other branch of a gather) committed past it and the workflow waited
    forever with nothing due. The outcome must go in with the claim, or not at all."""
    env = Env()
    # one conflict and a drive takes the lease; inline continuations reuse the begin's read
    env.engine.settings = replace(env.engine.settings, optimistic_attempts=1, trust_cache_for=1e9)
    square = env.registry.add_activity("square", lambda x: x * x)

    def fan(n: int) -> int:
        ctx = require_context("fan")
        return sum(wf.gather([ctx.call_activity("square", square.codec, (i + n,), {}) for i in range(2)]))

    eid, _ = env.engine.start(env.workflow(fan), (2,), {}, workflow_id="F")
    env.dispatcher.run_some(1)  # the first drive: two activity messages
    reqs = [item for kind, item in env.dispatcher.queue if kind == "activity"]
    env.dispatcher.queue.clear()
    assert [r.seq for r in reqs] == [1, 2]
    acts = env.engine.activities
    first, _ = acts.begin(eid, 1, 0)
    second, _ = acts.begin(eid, 2, 0)
    assert first is not None and second is not None

    real_replace, real_batch = env.store.replace, env.store.batch
    failed: list[str] = []

    def claims(doc: Doc | None) -> bool:
        return doc is not None and doc["id"] == "exec" and bool((doc.get("lease") or {}).get("holder"))

    def replace_(doc: Doc, if_match: str | None = None) -> str:
        if claims(doc) and not failed:
            failed.append("replace")
            raise StoreUnavailable("injected: the exec claim failed")
        return real_replace(doc, if_match)

    def batch_(pk: str, ops: Sequence[Op]) -> list[str | None]:
        if not failed and any(op.doc is not None and op.doc["id"] == "r:000001" and op.kind == "create" for op in ops):
            if not any(claims(op.doc) for op in ops):
                # a wake (whose drive message is lost) bumps the exec in the middle: the commit conflicts
                env.engine.wake(pk)
                env.dispatcher.queue.clear()
        if any(claims(op.doc) for op in ops) and not failed:
            failed.append("batch")
            raise StoreUnavailable("injected: the exec claim failed")
        return real_batch(pk, ops)

    env.store.replace = replace_  # type: ignore[method-assign]
    env.store.batch = batch_  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):  # conflict, then the claim fails
        acts.complete(first, acts.result_doc(first, value=4))
    assert failed
    acts.complete(second, acts.result_doc(second, value=9))  # from the partition read at its begin
    env.worker.run()
    for _ in range(5):  # beat's recovery passes, well past every lease and deadline
        env.clock.t += 600
        env.engine.recovery.scan()
        env.worker.run()
    assert env.ex(eid)["status"] == "completed", env.ex(eid)
    assert env.ex(eid)["result"] == 13


# --- signal_timeout_race: a signal accepted while the wait's timeout is being fired -------------


def test_a_signal_accepted_while_the_timeout_fires_wins() -> None:
    """``signal()`` returned True before the timeout was recorded, so the wait must see the value.
    ``fire_clock`` used to count the values sent as of *its* read, and record that count with the
    timeout even when a value was accepted between that read and the timeout's commit."""
    env = Env()

    def waiter() -> str:
        try:
            return str(wf.wait_signal("go", str, timeout=60))
        except DurableTimeoutError:
            return "timed out"

    eid = env.start(env.workflow(waiter, signals={"go": str}), wid="W")
    env.clock.t += 61
    real_drive = env.engine.driver.drive
    accepted: list[bool] = []

    def drive(execution_id: str, carry: Any = (), release: Any = (), trust_cache: float = 0.0) -> str:
        if not accepted and any(d.get("timeout") for d in carry):
            # the sender commits between fire_clock's read and the timeout's commit
            accepted.append(env.engine.signal(eid, "go", "hello"))
        return real_drive(execution_id, carry, release, trust_cache)

    env.engine.driver.drive = drive  # type: ignore[method-assign]
    assert env.engine.timers.fire_due_clocks() == 1
    env.worker.run()
    assert accepted == [True]
    assert env.ex(eid)["status"] == "completed"
    assert env.ex(eid)["result"] == "hello"


# --- stale_run_release: a late completion of an old run's activity ------------------------------


def test_a_late_outcome_of_a_previous_run_leaves_the_current_run_alone() -> None:
    """An attempt of run 0 finishes after its lease lapsed, another attempt finished the step and
    the workflow continued as new. Its drive used to release the marker of the *current* run with
    the same step number, so when run 1's activity message was lost nothing re-sent it."""
    env = Env()
    add = env.registry.add_activity("add", lambda x: x + 1)

    def counter(n: int) -> int:
        ctx = require_context("counter")
        got = int(ctx.call_activity("add", add.codec, (n,), {}).result())
        if n < 1:
            wf.continue_as_new(got)
        return got

    eid, _ = env.engine.start(env.workflow(counter), (0,), {}, workflow_id="C")
    env.dispatcher.run_some(1)  # run 0's first drive: one activity message
    env.dispatcher.queue.clear()
    acts = env.engine.activities
    late, _ = acts.begin(eid, 1, 0)
    env.clock.t += env.engine.settings.lease_ttl + 1  # its worker stalls: the lease lapses
    other, _ = acts.begin(eid, 1, 0)  # recovery's re-send runs on another worker
    assert late is not None and other is not None
    acts.complete(other, acts.result_doc(other, value=1))  # run 0 ends: continue as new
    env.dispatcher.run_some(1)  # run 1's first drive: its activity message
    assert env.ex(eid)["run"] == 1
    acts.complete(late, acts.result_doc(late, value=1))  # the stalled attempt of run 0 finishes
    current = env.store.read(eid, "s1:000001")
    assert current is not None and current["due_kind"] == "activity", current  # still run 1's, still due
    env.dispatcher.queue.clear()  # run 1's activity message is lost
    for _ in range(5):  # beat's recovery re-sends what was lost
        env.clock.t += 600
        env.engine.recovery.scan()
        env.worker.run()
    assert env.ex(eid)["status"] == "completed", env.ex(eid)
    assert env.ex(eid)["result"] == 2
