"""Local activities, signals between workflows and reset on a real worker (issue 13 items 3, 4,
6). In-process: tests/engine/test_local_activities.py, test_signal_channels.py, test_reset.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable import WorkflowFailedError
from tests.apps import channels

pytestmark = pytest.mark.worker

APP = "tests.apps.channels"


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    app = channels.app
    app.conf.update(broker_url=cluster.broker, task_default_queue=cluster.queue)
    app._pool = None
    app.amqp._producer_pool = None
    channels.durable.configure(store=cluster.store_url)
    cluster.start_worker(app=APP)
    yield cluster
    channels.durable.configure(store=None)


def test_local_steps_run_in_the_drive_on_a_worker(client: Any) -> None:
    h = channels.three.start(1)
    assert h.result(timeout=60) == 4
    steps = channels.durable.describe(h.id).steps
    assert [(s.kind, s.state, s.task_id) for s in steps] == [("activity", "ok", "local")] * 3
    ex = channels.durable.engine.store.read(h.id, "exec")
    assert ex is not None and ex["drives"] == 1


def test_signal_external_between_workflows_on_a_worker(client: Any) -> None:
    r = channels.receiver.start()
    s = channels.sender.start(r.id)
    assert s.result(timeout=60) == "sent"
    assert r.result(timeout=60) == "go:from a workflow"


def test_reset_a_failed_execution_on_a_worker(client: Any, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    h = channels.guarded.start(str(flag))
    with pytest.raises(WorkflowFailedError, match="missing"):
        h.result(timeout=60)
    flag.write_text("ok")
    assert [s.seq for s in h.reset(step=2, by="ops")] == [2]
    assert h.result(timeout=60) == [2, "found"]
    (op,) = channels.durable.describe(h.id).operations
    assert (op["action"], op["by"], op["step"]) == ("reset", "ops", 2)


def test_cli_reset_and_show(client: Any, tmp_path: Path) -> None:
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    def cli(*args: str) -> Any:
        return CliRunner().invoke(celery_cli, ["-A", APP, "durable", *args])

    flag = tmp_path / "flag"
    h = channels.guarded.start(str(flag))
    with pytest.raises(WorkflowFailedError):
        h.result(timeout=60)
    refused = cli("reset", h.id, "--step", "9", "--yes")
    assert refused.exit_code != 0 and "cannot reset to step 9" in refused.output
    flag.write_text("ok")
    done = cli("reset", h.id, "--step", "1", "--yes", "--reason", "fixed")
    assert done.exit_code == 0, done.output
    assert "step 1 (channels.inc) will run again" in done.output and "reset to step 1" in done.output
    assert h.result(timeout=60) == [2, "found"]
    shown = cli("show", h.id)
    assert shown.exit_code == 0, shown.output
    assert "reset to step 1 by" in shown.output and "local" in shown.output
