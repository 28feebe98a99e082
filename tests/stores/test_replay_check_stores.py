"""Issue 27 §3 on every store: histories recorded by one deploy's code, in a real SQLite file, a
PostgreSQL database and the Cosmos test server, checked against the next deploy's code — by
``durable replay-check`` (its table, its exit code) and by ``celery_durable.testing.replay`` —
find the incompatible change (with both calls at its step) and pass the compatible workflow;
``durable export`` writes a history that checks the same from its file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.stores.base import Store
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.testing.replay import ReplayMismatch, Verdict, replay
from tests.apps import replay_app, replay_old


@pytest.fixture
def recorded(store: Store) -> Iterator[Store]:
    """Two running executions recorded by the old code (each past its first step, waiting), one
    completed one, in ``store``; the new code's app pointed at it."""
    env = WorkflowEnvironment(replay_old.durable, store=store)
    env.start(replay_old.same, 1, _workflow_id="rp-same")
    env.start(replay_old.changed, 2, _workflow_id="rp-changed")
    done = env.start(replay_old.same, 3, _workflow_id="rp-done")
    done.signal("go", 1)
    env.run_until_idle()
    assert done.status() == "completed"
    replay_app.durable.configure(store=store)
    yield store
    replay_app.durable.configure(store=None)


def _cli(*args: str) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.replay_app", "durable", *args])


def test_replay_check_finds_the_incompatible_change(recorded: Store, tmp_path: Path) -> None:
    out = _cli("replay-check")
    assert out.exit_code == 1, out.output
    assert "rp-changed" in out.output and "incompatible" in out.output
    assert "activity 'rp.a'" in out.output and "activity 'rp.c'" in out.output
    assert "2 checked: 1 compatible, 1 incompatible" in out.output
    data = json.loads(_cli("replay-check", "--json").output)
    by_id = {e["execution_id"]: e for e in data["executions"]}
    assert by_id["rp-same"]["verdict"] == "compatible"
    assert (by_id["rp-changed"]["verdict"], by_id["rp-changed"]["step"]) == ("incompatible", 1)
    # the compatible workflow alone, every status: exit 0
    ok = _cli("replay-check", "--workflow", "rp.same", "--status", "any")
    assert ok.exit_code == 0, ok.output
    assert "2 checked: 2 compatible" in ok.output
    # export, then check from the file (no store read): the same verdict
    path = tmp_path / "changed.json"
    assert _cli("export", "rp-changed", "-o", str(path)).exit_code == 0
    from_file = _cli("replay-check", "--from", str(path))
    assert from_file.exit_code == 1 and "incompatible" in from_file.output


def test_the_pytest_helper_raises_on_the_incompatible_change(recorded: Store) -> None:
    with pytest.raises(ReplayMismatch, match="rp-changed") as caught:
        replay(replay_app.durable)
    assert sorted((v.execution_id, v.verdict) for v in caught.value.verdicts) == [
        ("rp-changed", Verdict.INCOMPATIBLE),
        ("rp-same", Verdict.COMPATIBLE),
    ]
    assert [v.verdict for v in replay(replay_app.durable, workflow="rp.same", status=None)] == [Verdict.COMPATIBLE] * 2
