"""`celery -A … durable` against a store with real executions (click's runner and a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from tests.apps import basic
from tests.plugins.workers import REPO

pytestmark = pytest.mark.worker


def _cli(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]  # noqa: A002
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args], input=input)


def test_list_and_show_real_executions(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    done = basic.sum_chain.start(3)
    assert done.result(timeout=60) == 3
    failed = basic.non_retryable.start("cli")
    failed.result(timeout=60)
    waiting = basic.approval.start(600.0)

    out = _cli("list")
    assert out.exit_code == 0, out.output
    assert done.id in out.output and waiting.id in out.output and "completed" in out.output
    only_running = _cli("list", "--status", "running", "--json")
    ids = [json.loads(line)["id"] for line in only_running.output.splitlines()]
    assert ids == [waiting.id]
    by_name = _cli("list", "--workflow", "sum_chain", "--json")
    assert [json.loads(line)["id"] for line in by_name.output.splitlines()] == [done.id]

    shown = _cli("show", done.id)
    assert shown.exit_code == 0, shown.output
    assert "status     completed" in shown.output and "result     3" in shown.output
    assert shown.output.count("tests.apps.basic.add") == 3 and f"{done.id}:1" in shown.output
    data = json.loads(_cli("show", done.id, "--json").output)
    assert [s["state"] for s in data["steps"]] == ["ok", "ok", "ok"] and data["result"] == 3

    sig = _cli("signal", waiting.id, "approval", '{"ok": true, "by": "cli"}')
    assert sig.exit_code == 0 and "delivered" in sig.output
    assert waiting.result(timeout=30) == "cli:True"


def test_errors_are_clear(cluster) -> None:  # type: ignore[no-untyped-def]
    out = _cli("show", "no-such-id")
    assert out.exit_code != 0 and "unknown execution id 'no-such-id'" in out.output
    h = basic.approval.start(600.0)
    bad = _cli("signal", h.id, "approval", "{not json")
    assert bad.exit_code != 0 and "not valid JSON" in bad.output
    wrong = _cli("signal", h.id, "approval", '{"ok": "perhaps"}')
    assert wrong.exit_code != 0 and "invalid signal" in wrong.output
    refused = _cli("cancel", h.id, input="n\n")
    assert refused.exit_code != 0 and h.poll().cancel_requested is False
    assert _cli("cancel", h.id, "--yes").exit_code == 0 and h.poll().cancel_requested is True


def test_retry_reruns_the_failed_step(cluster) -> None:  # type: ignore[no-untyped-def]
    from celery_durable import WorkflowFailedError

    cluster.start_worker()
    flag = cluster.workers.tmp / "flag-retry"
    h = basic.fragile.start(str(flag))
    with pytest.raises(WorkflowFailedError, match="is missing"):
        h.result(timeout=60)
    running = basic.approval.start(600.0)
    refused = _cli("retry", running.id, "--yes")
    assert refused.exit_code != 0 and "running, not failed" in refused.output
    flag.write_text("fixed")  # the operator fixes the cause, then retries
    out = _cli("retry", h.id, "--yes")
    assert out.exit_code == 0, out.output
    assert "step 1 (tests.apps.basic.needs_flag) will run again" in out.output
    assert h.result(timeout=60) == "flag found"


def test_cli_as_a_subprocess(cluster) -> None:  # type: ignore[no-untyped-def]
    cluster.start_worker()
    h = basic.sum_chain.start(2)
    h.result(timeout=60)
    env = dict(cluster.workers.env) | {"PATH": __import__("os").environ["PATH"]}
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.basic", "durable", "show", h.id],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert h.id in proc.stdout and "completed" in proc.stdout
