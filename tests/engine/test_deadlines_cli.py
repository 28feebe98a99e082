"""Deadlines and delayed starts through the operator's tools: ``celery durable list --status
timed_out|scheduled``, ``show`` (the deadline, the start), ``resume`` of a timed-out execution and
``cancel`` of a scheduled one; and the ``workflow_timed_out`` library signal.

The module is also the Celery app the CLI runs against (``-A tests.engine.test_deadlines_cli``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.signals import workflow_timed_out
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("deadline-cli-tests", set_as_current=False, broker="memory://")  # the CLI's sends go nowhere
durable = Durable(app, store="memory://")


@durable.workflow(name="dc.waiter", signals={"go": str})
def waiter() -> str:
    return str(wf.wait_signal("go"))


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    durable.configure(store=f"sqlite:///{tmp_path / 'cli.db'}")  # shared with the CLI
    return WorkflowEnvironment(durable, store=durable.store, start=2_000_000.0)


def _cli(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.engine.test_deadlines_cli", "durable", *args])


def _rows(*args: str) -> list[dict[str, Any]]:
    out = _cli("list", *args, "--json")
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_list_show_and_resume_a_timed_out_execution(env: WorkflowEnvironment) -> None:
    fired: list[str] = []

    def on_timeout(sender: Any, execution_id: str, **_: Any) -> None:
        fired.append(f"{sender}:{execution_id}")

    workflow_timed_out.connect(on_timeout, weak=False)
    try:
        h = env.start(waiter.options(timeout=60, workflow_id="dc-1"))
        env.advance(60)
    finally:
        workflow_timed_out.disconnect(on_timeout)
    assert fired == ["dc.waiter:dc-1"]  # once, from the commit that ended it
    assert [r["id"] for r in _rows("--status", "timed_out")] == ["dc-1"]
    assert _rows("--status", "running") == []
    shown = _cli("show", "dc-1")
    assert shown.exit_code == 0, shown.output
    assert "timed_out" in shown.output and "deadline" in shown.output and "WorkflowTimedOutError" in shown.output
    data = json.loads(_cli("show", "dc-1", "--json").stdout)
    assert data["status"] == "timed_out" and data["deadline_at"] is not None

    done = _cli("resume", "dc-1", "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["status_before"] == "timed_out"
    env.run_until_idle()
    assert h.status() == "running"
    env.signal(h, "go", "after all")
    assert h.result(timeout=0) == "after all"


def test_list_and_cancel_a_scheduled_execution(env: WorkflowEnvironment) -> None:
    h = env.start(waiter.options(start_delay=600, workflow_id="dc-2"))
    assert [r["id"] for r in _rows("--status", "scheduled")] == ["dc-2"]
    assert "starts" in _cli("show", "dc-2").output
    out = _cli("cancel", "dc-2", "--yes", "--json")
    assert out.exit_code == 0, out.output
    assert h.status() == "cancelled"
    env.advance(600)
    assert h.status() == "cancelled"
    assert [r["id"] for r in _rows("--status", "cancelled")] == ["dc-2"]
