"""Issue 25 (the rest a Celery user expects): ``--json`` on every command, ISO timestamps in the
JSON, ``purge --dry-run`` lists what it would delete, and ``--json`` on a destructive command
asks for ``--yes`` instead of printing a prompt into a script's JSON.

The module is also the Celery app the CLI runs against (``-A tests.engine.test_cli_json``)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import pytest
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.cli.commands import durable as durable_group
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("cli-json-tests", set_as_current=False, broker="memory://")  # the CLI's sends go nowhere
durable = Durable(app, store="memory://")
broken = {"ship": True}


@durable_activity(name="cj.ship")
def ship(order: str) -> str:
    if broken["ship"]:
        raise NonRetryableError("truck broke down")
    return "shipped " + order


@durable.workflow(name="cj.order", signals={"go": bool})
def order(order_id: str, wait: bool = False) -> str:
    if wait:
        wf.wait_signal("go")
    return ship(order_id)


@durable_activity(name="cj.copy", autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=3600)
def copy(table: str) -> str:
    from celery_durable import activity

    activity.heartbeat({"table": table, "rows": 1200})
    raise ConnectionError("the replica went away")


@durable.workflow(name="cj.copying")
def copying(table: str) -> str:
    return copy(table)


@durable.effect("cj.notify", max_attempts=1)
def notify(to: str) -> None:
    raise ConnectionRefusedError(f"no route to {to}")


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    broken["ship"] = True
    durable.configure(store=f"sqlite:///{tmp_path / 'cli.db'}")  # shared with the CLI
    return WorkflowEnvironment(durable, store=durable.store)


def _cli(*args: str, input: str | None = None) -> Result:  # noqa: A002
    return CliRunner().invoke(celery_cli, ["-A", "tests.engine.test_cli_json", "durable", *args], input=input)


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _iso(value: Any) -> datetime:
    assert isinstance(value, str), value
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    return parsed


def test_every_command_takes_json() -> None:
    """Every command a script runs (``ui`` serves pages and prints none) has ``--json``."""
    missing = []

    def walk(group: click.Group, path: str) -> None:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{path} {name}")
            elif name != "ui" and "--json" not in {o for p in cmd.params for o in getattr(p, "opts", ())}:
                missing.append(f"{path} {name}")

    walk(durable_group, "durable")
    assert missing == []


def test_list_and_show_print_iso_timestamps(env: WorkflowEnvironment) -> None:
    before = time.time()
    h = env.start(order, "o-1", _workflow_id="o-1")
    assert h.status() == "failed"
    (row,) = [json.loads(line) for line in _cli("list", "--json").stdout.splitlines()]
    assert row["id"] == "o-1" and abs(_iso(row["created_at"]).timestamp() - before) < 60
    data = _json(_cli("show", "o-1", "--json"))
    assert _iso(data["updated_at"]) >= _iso(data["created_at"])
    (step,) = data["steps"]
    assert step["name"] == "cj.ship" and _iso(step["finished_at"]) >= _iso(step["scheduled_at"])


def test_a_destructive_json_command_needs_yes_and_changes_nothing_without(env: WorkflowEnvironment) -> None:
    h = env.start(order, "o-2", True, _workflow_id="o-2")
    for args in (["cancel", "o-2"], ["retry", "o-2"], ["reset", "o-2", "--step", "1"], ["purge", "--older-than", "0s"]):
        out = _cli(*args, "--json")
        assert out.exit_code == 2 and "--json needs --yes" in out.output, (args, out.output)
    assert h.status() == "running" and not durable.describe("o-2").operations


def test_operations_print_what_they_did_as_json(env: WorkflowEnvironment) -> None:
    env.start(order, "o-3", _workflow_id="o-3")
    broken["ship"] = False
    done = _json(_cli("retry", "o-3", "--yes", "--json", "--reason", "fixed"))
    assert done["action"] == "retry" and done["status_before"] == "failed"
    assert done["rerun"] == [{"seq": 1, "kind": "activity", "name": "cj.ship"}]
    h = env.start(order, "o-4", True, _workflow_id="o-4")
    sent = _json(_cli("signal", "o-4", "go", "true", "--json"))
    assert sent == {"id": "o-4", "action": "signal", "name": "go", "delivered": True}
    env.engine.driver.drive("o-4")  # the CLI's drive message went to Celery's broker, not to env
    env.run_until_idle()
    assert h.status() == "completed"
    h5 = env.start(order, "o-5", True, _workflow_id="o-5")
    cancelled = _json(_cli("cancel", "o-5", "--yes", "--json"))
    assert cancelled == {"id": "o-5", "action": "cancel", "requested": True, "status_before": "running"}
    env.engine.driver.drive("o-5")
    env.run_until_idle()
    assert h5.status() == "cancelled"
    again = _json(_cli("cancel", "o-5", "--yes", "--json"))
    assert again["requested"] is False and again["status_before"] == "cancelled"
    resumed = _json(_cli("resume", "o-5", "--yes", "--json"))
    assert resumed["action"] == "resume" and resumed["status_before"] == "cancelled"


def test_purge_dry_run_lists_what_it_would_delete_and_deletes_nothing(env: WorkflowEnvironment) -> None:
    for eid in ("p-1", "p-2"):
        env.start(order, eid, _workflow_id=eid)
    env.start(order, "p-live", True, _workflow_id="p-live")  # running: never purged
    text = _cli("purge", "--older-than", "0s", "--dry-run")
    assert text.exit_code == 0, text.output
    assert "would purge 2" in text.stdout and "p-1" in text.stdout and "p-2" in text.stdout
    assert "p-live" not in text.stdout
    data = _json(_cli("purge", "--older-than", "0s", "--dry-run", "--json"))
    assert data["dry_run"] is True
    assert sorted((r["id"], r["status"]) for r in data["would_purge"]) == [("p-1", "failed"), ("p-2", "failed")]
    assert all(_iso(r["ended_at"]) for r in data["would_purge"])
    listed = {json.loads(line)["id"] for line in _cli("list", "--json").stdout.splitlines()}
    assert listed == {"p-1", "p-2", "p-live"}  # nothing deleted
    done = _json(_cli("purge", "--older-than", "0s", "--yes", "--json"))
    assert (done["purged"], done["kept"]) == (2, 0) and done["documents"] >= 4
    listed = {json.loads(line)["id"] for line in _cli("list", "--json").stdout.splitlines()}
    assert listed == {"p-live"}


def _notify(env: WorkflowEnvironment, effect_id: str, key: str) -> None:
    core = env.engine.outbox
    body = core.effect_body(
        "cj.notify",
        "ops@example.com",
        key=key,
        effect_id=effect_id,
        available_at=None,
        replay_safe=True,
        max_attempts=1,
    )
    core.admit(body)


def test_outbox_problems_lists_failed_effects_and_stuck_lanes(env: WorkflowEnvironment) -> None:
    assert _json(_cli("outbox", "problems", "--json")) == {
        "failed": [], "stuck": [], "grace": 10.0, "more_failed": False, "more_stuck": False
    }  # fmt: skip
    assert "no failed effects" in _cli("outbox", "problems").stdout
    env.clock.t -= 3600  # what follows happened an hour ago (the CLI reads the real clock)
    _notify(env, "n-1", "mail-1")
    env.run_until_idle()  # its handler fails: one attempt
    _notify(env, "n-2", "mail-2")
    env.dispatcher.queue.clear()  # its message is lost, and no beat runs the scan
    data = _json(_cli("outbox", "problems", "--json"))
    (failed,) = data["failed"]
    assert (failed["id"], failed["key"], failed["type"], failed["status"]) == ("n-1", "mail-1", "cj.notify", "failed")
    assert "no route to ops@example.com" in failed["last_error"]
    assert abs(_iso(failed["completed_at"]).timestamp() - env.clock.now()) < 1
    (stuck,) = data["stuck"]
    assert (stuck["key"], stuck["why"], stuck["effect_id"], stuck["effect_type"]) == (
        "mail-2", "unclaimed", "n-2", "cj.notify"
    )  # fmt: skip
    assert _iso(stuck["due_at"]).timestamp() < time.time() - 3000
    text = _cli("outbox", "problems").stdout
    assert "n-1" in text and "mail-2" in text and "unclaimed" in text
    # retried: the failed row stays (retried_as says by what) and leaves the overview
    assert _json(_cli("outbox", "retry", "n-1", "--yes", "--json"))["enqueued"] == "n-1:retry1"
    assert _json(_cli("outbox", "problems", "--json"))["failed"] == []
    (row,) = [
        json.loads(line)
        for line in _cli("outbox", "list", "--key", "mail-1", "--json", "--status", "failed").stdout.splitlines()
    ]
    assert (row["id"], row["retried_as"]) == ("n-1", "n-1:retry1")


def test_show_prints_an_activitys_latest_heartbeat(env: WorkflowEnvironment) -> None:
    """Issue 26 §2: the details a running (here: backing off) activity sent with its heartbeat."""
    env.start(copying.options(workflow_id="copy-1"), "orders")
    text = _cli("show", "copy-1")
    assert text.exit_code == 0, text.output
    assert re.search(r'heartbeat .* \(attempt 1\): \{"table": "orders", "rows": 1200\}', text.output), text.output
    (step,) = [s for s in _json(_cli("show", "copy-1", "--json"))["steps"] if s["kind"] == "activity"]
    assert step["heartbeat"] == {"table": "orders", "rows": 1200} and step["heartbeat_attempt"] == 1
