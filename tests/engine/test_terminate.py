"""Terminate (issue 25): end a running execution now, running nothing more. Unlike cancel, no
compensation runs and the workflow's code is never driven again; its running children end too,
its parent is told, an activity still running is recorded late and changes nothing; the action
is recorded (who, why) and ``resume`` reopens it on its history."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.drive.recovery import ScanReport
from celery_durable.errors import ChildWorkflowError, WorkflowFailedError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("terminate-tests", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
ran: list[str] = []


@durable_activity(name="tt.book")
def book(what: str) -> str:
    ran.append("book " + what)
    return what


@durable_activity(name="tt.unbook")
def unbook(what: str) -> str:
    ran.append("unbook " + what)
    return what


@durable_activity(name="tt.slow", autoretry_for=(RuntimeError,), default_retry_delay=60, max_retries=3)
def slow(what: str) -> str:
    """Fails its first attempt for ``what``: its retry waits a minute (the step in flight, unleased)."""
    ran.append("slow " + what)
    if ran.count("slow " + what) == 1:
        raise RuntimeError("first attempt")
    return what


@durable.workflow(name="tt.slowly")
def slowly(what: str) -> str:
    return slow(what)


@durable.workflow(name="tt.trip", signals={"go": bool})
def trip(what: str) -> str:
    with wf.Saga() as saga:
        book(what)
        saga.add(unbook, what)
        wf.wait_signal("go")
        return book(what + " again")


@durable.workflow(name="tt.kid", signals={"go": bool})
def kid(n: int) -> int:
    wf.sleep(timedelta(days=1))
    return n


@durable.workflow(name="tt.parent")
def parent(n: int) -> list[int]:
    futures = [kid.start_child(i, _workflow_id=f"{wf.execution_id()}-k{i}") for i in range(n)]
    return [f.result() for f in futures]


@durable.workflow(name="tt.watcher")
def watcher() -> str:
    try:
        return str(trip.start_child("x", _workflow_id=f"{wf.execution_id()}-trip").result())
    except ChildWorkflowError as exc:
        return f"child ended: {exc}"


@pytest.fixture
def env() -> WorkflowEnvironment:
    ran.clear()
    return WorkflowEnvironment(durable)


def test_terminate_ends_it_now_and_runs_no_compensation(env: WorkflowEnvironment) -> None:
    h = env.start(trip, "hotel")
    assert ran == ["book hotel"] and h.status() == "running"
    assert h.terminate(by="alice", reason="poison input") is True
    with pytest.raises(WorkflowFailedError, match="WorkflowTerminated.*terminated by alice: poison input"):
        env.result(h)
    env.signal(h, "go", True)  # nothing is driven any more: the signal is refused
    env.advance(timedelta(days=2))
    assert ran == ["book hotel"]  # no unbook (a cancel would have run it), no second booking
    info = Admin(env.engine).describe(h.id)
    assert [(op["action"], op["by"], op["reason"]) for op in info.operations] == [
        ("terminate", "alice", "poison input")
    ]
    assert h.terminate(by="alice") is False  # ended: nothing to terminate


def test_a_cancel_would_compensate_for_comparison(env: WorkflowEnvironment) -> None:
    h = env.start(trip, "car")
    env.cancel(h)
    env.run_until_idle()
    assert ran == ["book car", "unbook car"]


def test_terminate_ends_the_running_children_and_tells_the_parent(env: WorkflowEnvironment) -> None:
    h = env.start(parent, 3)
    kids = [env.handle(f"{h.id}-k{i}") for i in range(3)]
    assert [k.status() for k in kids] == ["running"] * 3
    assert h.terminate(by="ops") is True
    env.run_until_idle()
    assert [k.status() for k in kids] == ["failed"] * 3
    assert all("its parent" in (k.poll().error or {}).get("message", "") for k in kids)

    w = env.start(watcher)
    child = env.handle(f"{w.id}-trip")
    assert child.terminate(by="ops", reason="stuck") is True
    env.run_until_idle()
    assert env.result(w).startswith("child ended:") and "terminated by ops: stuck" in env.result(w)


def test_a_terminated_execution_can_be_resumed_on_its_history(env: WorkflowEnvironment) -> None:
    h = env.start(trip, "train")
    h.terminate(by="ops")
    env.run_until_idle()
    Admin(env.engine).resume(h.id, by="ops", reason="fixed")
    env.run_until_idle()
    env.signal(h, "go", True)
    assert env.result(h) == "train again" and ran == ["book train", "book train again"]


@pytest.mark.parametrize("reopen", ["resume", "retry", "reset"])
def test_a_step_in_flight_when_terminated_runs_again_once_reopened(env: WorkflowEnvironment, reopen: str) -> None:
    """Terminated while its activity waits for its retry: the retry is refused (the execution
    ended) and the recovery scan settles the step's marker (no result, nothing due). A resume or
    a retry reopens the execution keeping that step, which has no outcome: it is re-armed (sent
    again, due), not left for an attempt that will never come (found by the simulation's batch
    terminate, then an operator's retry or reset: harness/sim_batch.py, seeds 23 and 122)."""
    h = env.start(slowly, "x")
    assert ran == ["slow x"] and h.status() == "running"
    assert h.terminate(by="ops") is True
    env.advance(timedelta(minutes=10))  # the retry message came (refused: ended), the step is due
    env.engine.recovery.scan()  # beat's scan settles the ended execution's marker
    marker = env.store.read(h.id, "s:000001") or {}
    assert marker.get("due_kind") is None and not marker.get("lease") and env.store.read(h.id, "r:000001") is None
    step = {"step": 2} if reopen == "reset" else {}  # reset to after step 1: it keeps step 1
    getattr(Admin(env.engine), reopen)(h.id, by="ops", reason="fixed", **step)
    env.run_until_idle()
    env.advance(timedelta(minutes=2))
    assert env.result(h, max_time=timedelta(hours=1)) == "x" and ran == ["slow x", "slow x"]


def test_a_recovery_scan_that_read_the_ended_execution_settles_nothing_once_it_is_reopened(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan read the partition while the execution was terminated (its step in flight: due,
    not leased), a retry reopened it (the step kept as it is: due already), then the scan settled
    the step's marker on what it had read: nothing due, the step never sent again, the execution
    running forever (the simulation, seed 2465). The settle of an ended execution's marker is
    guarded by the exec as read: a reopening since fails it."""
    h = env.start(slowly, "x")
    assert h.terminate(by="ops") is True
    env.retries.clear()  # the step's retry message is lost: only the recovery scan can send it again
    stale = {d["id"]: d for d in env.store.query_partition(h.id).docs}
    Admin(env.engine).retry(h.id, by="ops", reason="fixed")
    env.run_until_idle()
    assert (env.store.read(h.id, "s:000001") or {}).get("due_kind") == "activity"  # kept: due already
    load = env.engine.cache.load
    with monkeypatch.context() as m:  # the scan goes on with the partition it read before the retry
        m.setattr(env.engine.cache, "load", lambda pk, *a, **k: stale if pk == h.id else load(pk, *a, **k))
        env.engine.recovery._activity_due(h.id, "s:000001", env.clock.now(), ScanReport())
    assert (env.store.read(h.id, "s:000001") or {}).get("due_kind") == "activity"
    env.advance(timedelta(minutes=10))
    env.engine.recovery.scan()  # the step is due: sent again
    assert env.result(h, max_time=timedelta(hours=1)) == "x"


@pytest.mark.parametrize("reopen", ["retry", "reset"])
def test_a_terminated_parent_reopened_reopens_the_children_its_cascade_ended(
    env: WorkflowEnvironment, reopen: str
) -> None:
    """As a resume does: a retry (re-driven as it is) or a reset to after the child steps kept the
    children's terminated outcomes and failed again at once (ChildWorkflowError) — found by the
    simulation's batch terminate, then a batch retry of the failed or an operator's reset
    (harness/sim_batch.py, seeds 38 and 581)."""
    h = env.start(parent, 2)
    assert h.terminate(by="ops") is True
    env.run_until_idle()
    step = {"step": 3} if reopen == "reset" else {}  # after both child steps: it keeps them
    getattr(Admin(env.engine), reopen)(h.id, by="ops", reason="fixed", **step)
    env.run_until_idle()
    assert [env.handle(f"{h.id}-k{i}").status() for i in range(2)] == ["running"] * 2
    assert env.result(h) == [0, 1]


def test_the_cli_terminates_with_yes_and_json(env: WorkflowEnvironment, tmp_path: Any) -> None:
    durable.configure(store=f"sqlite:///{tmp_path / 't.db'}")
    try:
        local = WorkflowEnvironment(durable, store=durable.store)
        h = local.start(trip, "boat")
        run = CliRunner().invoke(
            celery_cli,
            ["-A", "tests.engine.test_terminate", "durable", "terminate", h.id, "--yes", "--json", "--reason", "r"],
        )
        assert run.exit_code == 0, run.output
        assert json.loads(run.stdout) == {
            "id": h.id,
            "action": "terminate",
            "terminated": True,
            "status_before": "running",
        }
        assert h.status() == "failed"
    finally:
        durable.configure(store="memory://")


@pytest.mark.parametrize("reopen", ["retry", "resume"])
def test_a_terminated_parent_reopened_before_its_children_told_it_reopens_them_too(
    env: WorkflowEnvironment, reopen: str
) -> None:
    """The cascade's children end terminated at once, but tell their parent later (a message, and
    the scan's safety net). A retry or resume of the parent in between found no outcome of theirs
    to forget, so left them ended; their late report then failed the reopened parent
    (ChildWorkflowError) — found by the simulation (seed 344: a batch terminate, then a retry)."""
    h = env.start(parent, 2)
    real = env.engine.children.notify_parent
    env.engine.children.notify_parent = lambda eid: None  # type: ignore[method-assign]
    assert h.terminate(by="ops") is True  # the children's reports lost: left to the scan
    env.engine.children.notify_parent = real  # type: ignore[method-assign]
    assert [env.handle(f"{h.id}-k{i}").status() for i in range(2)] == ["failed"] * 2
    assert env.handle(h.id).poll().status == "failed"
    getattr(Admin(env.engine), reopen)(h.id, by="ops", reason="fixed")
    env.run_until_idle()
    env.advance(timedelta(seconds=3 * env.engine.settings.drive_timeout))  # the scan's safety net
    assert [env.handle(f"{h.id}-k{i}").status() for i in range(2)] == ["running"] * 2
    assert env.result(h) == [0, 1]
