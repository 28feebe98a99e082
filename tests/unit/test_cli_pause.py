"""``celery -A proj durable pause ID`` / ``unpause ID``: recorded, idempotent, shown by ``show``;
an ended execution is a clear refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.apps import replay_app, replay_old


@pytest.fixture
def env() -> Iterator[WorkflowEnvironment]:
    store = MemoryStore()
    env = WorkflowEnvironment(replay_old.durable, store=store)
    replay_app.durable.configure(store=store)
    yield env
    replay_app.durable.configure(store=None)


def _cli(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.replay_app", "durable", *args])


def test_pause_show_unpause(env: WorkflowEnvironment) -> None:
    h = env.start(replay_old.same, 1, _workflow_id="cp-1")
    out = _cli("pause", "cp-1", "--reason", "looking")
    assert out.exit_code == 0 and "paused" in out.output, out.output
    assert "paused since" in _cli("show", "cp-1").output
    assert json.loads(_cli("pause", "cp-1", "--json").output) == {"id": "cp-1", "action": "pause", "changed": False}
    h.signal("go", 1)
    env.run_until_idle()
    assert h.status() == "running"
    assert "unpaused: driven now" in _cli("unpause", "cp-1").output
    env.engine.dispatcher.send_drive("cp-1")  # the drive the CLI sent, received by a worker (the env's)
    env.run_until_idle()
    assert h.status() == "completed"
    refused = _cli("pause", "cp-1")
    assert refused.exit_code != 0 and "ended execution cannot pause" in refused.output
    actions = [o["action"] for o in json.loads(_cli("show", "cp-1", "--json").output).get("operations", [])]
    assert actions == ["pause", "unpause"]


def test_batch_starts_a_batch_workflow_and_needs_yes_with_json(env: WorkflowEnvironment) -> None:
    """``durable batch pause --workflow W --yes`` starts the batch (a workflow of its own, run by
    the workers: here the environment's) and prints its id; with --json, --yes is required."""
    for i in range(3):
        env.start(replay_old.same, i, _workflow_id=f"cb-{i}")
    refused = _cli("batch", "pause", "--workflow", "rp.same", "--json")
    assert refused.exit_code != 0 and "--yes" in refused.output
    out = _cli("batch", "pause", "--workflow", "rp.same", "--status", "running", "--yes", "--json")
    assert out.exit_code == 0, out.output
    bid = json.loads(out.output)["id"]
    env.engine.dispatcher.send_drive(bid)  # its first drive, received by a worker (the environment's)
    env.run_until_idle()
    done = env.engine.read_exec(bid)
    assert done["status"] == "completed" and done["result"]["done"] == 3
    assert all(env.engine.read_exec(f"cb-{i}").get("paused") for i in range(3))
    bad = _cli("batch", "reset", "--yes")
    assert bad.exit_code != 0 and "step" in bad.output
