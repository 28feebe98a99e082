"""Breaker tests for issue 25: terminate, and the CLI's --json. Each failed before its fix, because of the
bug its docstring names. The module is also the Celery app the CLI runs against
(``-A tests.engine.test_issue25_breaks``)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_durable import durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment
from tests.engine.test_terminate import app, durable, ran, trip  # noqa: F401 - app: the CLI's -A

# the trip (a Saga that books, then waits) and its app are test_terminate's; ``app`` is also
# the Celery app the CLI test runs against (``-A tests.engine.test_issue25_breaks``)
undo_calls: list[str] = []


@durable.workflow(name="b25.kid", signals={"go": bool})
def kid(n: int) -> int:
    wf.wait_signal("go")
    return n


@durable.workflow(name="b25.parent")
def parent(n: int) -> list[int]:
    futures = [kid.start_child(i, _workflow_id=f"{wf.execution_id()}-k{i}") for i in range(n)]
    return [f.result() for f in futures]


@durable_activity(name="b25.slow_undo", autoretry_for=(RuntimeError,), max_retries=5, default_retry_delay=3600)
def slow_undo(what: str) -> str:
    """A compensation whose first attempt fails and is retried an hour later."""
    undo_calls.append(what)
    if undo_calls.count(what) == 1:
        raise RuntimeError("not yet")
    ran.append("undo " + what)
    return what


@durable.workflow(name="b25.ckid")
def ckid(n: int) -> int:
    with wf.Saga() as saga:
        saga.add(slow_undo, f"kid{n}")
        wf.sleep(timedelta(days=10))
        return n


@durable.workflow(name="b25.cparent")
def cparent(n: int) -> int:
    with wf.Saga() as saga:
        saga.add(slow_undo, "parent")
        return ckid.start_child(n, _workflow_id=f"{wf.execution_id()}-kid").result()


@durable.workflow(name="b25.echo")
def echo_wf(data: dict) -> dict:
    wf.set_status({"ship_at": data["ship_at"]})
    return data


@pytest.fixture
def env() -> WorkflowEnvironment:
    ran.clear()
    undo_calls.clear()
    return WorkflowEnvironment(durable)


def test_resume_after_terminate_keeps_an_operators_pending_cancel(env: WorkflowEnvironment) -> None:
    """Alice cancels a running execution; before its next drive delivers the cancel, Bob terminates
    it; Carol resumes the terminated execution. The resume reopens it with
    ``cancel_requested=False`` (Admin._operate's ``reopened`` fields; _plan_resume keeps nothing
    for a failed execution, unlike _plan_retry, which keeps the cancel "never downgraded"), so
    Alice's recorded cancel is silently dropped: the workflow runs on, books again and completes,
    and its compensation never runs. Expected: the cancel still stands after the resume (the
    execution ends cancelled, compensated), as it does after a retry."""
    h = env.start(trip, "hotel")
    assert env.engine.cancel(h.id, by="alice") is True  # requested, not delivered yet
    assert env.engine.read_exec(h.id).get("cancel_requested") is True
    assert h.terminate(by="bob") is True
    Admin(env.engine).resume(h.id, by="carol")
    env.run_until_idle()
    assert env.engine.read_exec(h.id).get("cancel_requested") is True, "the resume dropped alice's cancel"
    env.signal(h, "go", True)
    env.run_until_idle()
    assert h.status() == "cancelled"
    assert "book hotel again" not in ran and "unbook hotel" in ran


def test_terminate_ends_a_running_child_that_is_still_compensating(env: WorkflowEnvironment) -> None:
    """Terminate promises that the execution's running children are terminated too. A parent
    whose cancel is in progress (its own compensation retrying) has a child that is also still
    running its compensation: the cancel recorded a cancelled outcome for the child step, so
    terminate.py ``_running_children`` (a child step without a result document) skips it. The
    child stays ``running`` after its parent's terminate and later runs its compensation.
    Expected: the child is terminated with the parent (failed, WorkflowTerminated) and runs
    nothing more."""
    h = env.start(cparent, 1)
    child = env.handle(f"{h.id}-kid")
    env.cancel(h)
    assert h.status() == "running" and child.status() == "running"  # both compensating
    assert h.terminate(by="ops", reason="stop everything") is True
    env.run_until_idle()
    assert child.status() == "failed", f"the child is {child.status()} after its parent was terminated"
    env.advance(timedelta(hours=2))
    assert "undo kid1" not in ran


def test_resume_of_a_terminated_parent_is_not_failed_by_its_own_terminate(env: WorkflowEnvironment) -> None:
    """``resume`` is documented to reopen a terminated execution on its recorded history. But the
    terminate also terminated its running children, and those ends are recorded in the parent as
    child failures; resume (operator._plan_resume for a failed execution: nothing reopened)
    neither reopens the children it ended nor forgets those outcomes, so the resumed parent fails
    again at once with ChildWorkflowError ("its parent ... was terminated"). Compare resume of a
    cancelled parent, which resumes the children its cancel ended. Expected: after resume the parent
    runs again and waits for its children (reopened), and completes when they are signalled."""
    h = env.start(parent, 2)
    assert h.terminate(by="ops") is True
    env.run_until_idle()
    Admin(env.engine).resume(h.id, by="ops", reason="fixed")
    env.run_until_idle()
    assert h.status() == "running", (h.status(), (h.poll().error or {}).get("message"))
    for i in range(2):
        env.signal(f"{h.id}-k{i}", "go", True)
    assert env.result(h) == [0, 1]


def test_cli_json_does_not_rewrite_user_values_named_like_timestamps(tmp_path: Path) -> None:
    """``--json`` promises ISO timestamps for the CLI's own time fields, but json_out._times
    rewrites every key named ``at``, ``until`` or ``*_at`` at any depth, user data included: a
    workflow's payload, result and custom status (``durable show --json``; ``list --json`` the
    custom status, search attributes and memo). A number the user stored as ``{"ship_at":
    1700000000, "until": 5}`` is printed as ``"2023-11-14T22:13:20+00:00"`` and
    ``"1970-01-01T00:00:05+00:00"``: the value changes silently. Expected: user values printed as
    stored."""
    durable.configure(store=f"sqlite:///{tmp_path / 'j.db'}")
    try:
        local = WorkflowEnvironment(durable, store=durable.store)
        data = {"ship_at": 1700000000, "until": 5, "at": 7}
        h = local.start(echo_wf, data)
        assert local.result(h) == data
        run = CliRunner().invoke(
            celery_cli, ["-A", "tests.engine.test_issue25_breaks", "durable", "show", h.id, "--json"]
        )
        assert run.exit_code == 0, run.output
        shown = json.loads(run.stdout)
        listed = CliRunner().invoke(celery_cli, ["-A", "tests.engine.test_issue25_breaks", "durable", "list", "--json"])
        assert listed.exit_code == 0, listed.output
        row = json.loads(listed.stdout.splitlines()[0])
    finally:
        durable.configure(store="memory://")
    assert shown["result"] == data
    assert shown["payload"]["args"] == [data]
    assert shown["custom_status"] == {"ship_at": 1700000000}
    assert row["custom_status"] == {"ship_at": 1700000000}
