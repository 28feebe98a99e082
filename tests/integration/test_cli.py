"""`celery -A … durable` against a store with real executions (click's runner and a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

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


# --- input validation, corrupt documents and configuration errors (no worker needed) ------------


@pytest.fixture
def sqlite_store(tmp_path):  # type: ignore[no-untyped-def]
    """The test app on a fresh SQLite store holding three executions (two old, one recent)."""
    import time

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    basic.durable.configure(store=url)
    now = time.time()
    for i, (status, age) in enumerate([("completed", 10 * 86400), ("failed", 9 * 86400), ("running", 60)]):
        basic.durable.store.create(
            {
                "pk": f"x{i}",
                "id": "exec",
                "type": "exec",
                "workflow": "sum_chain",
                "status": status,
                "steps": 0,
                "run": 0,
                "created_at": now - age,
                "updated_at": now - age,
                "completed_at": now - age,
            }  # fmt: skip
        )
    yield tmp_path / "cli.db"
    basic.durable.configure(store=None)


@pytest.fixture
def empty_store(tmp_path):  # type: ignore[no-untyped-def]
    basic.durable.configure(store=f"sqlite:///{tmp_path / 'empty.db'}")
    yield
    basic.durable.configure(store=None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--limit", "-1"], "--limit"),
        (["list", "--limit", "0"], "--limit"),
        (["list", "--older-than", "garbage"], "not an age"),
        (["list", "--newer-than", "5 minutes"], "not an age"),
        (["list", "--status", "finished"], "--status"),
        (["purge", "--older-than", "3x", "--yes"], "not an age"),
    ],
)
def test_bad_input_is_refused_up_front(empty_store, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    """Even on an empty store, where nothing would ever look at the value."""
    out = _cli(*args)
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output


def test_limit_is_honoured_across_pages_and_a_cursor_continues(sqlite_store) -> None:  # type: ignore[no-untyped-def]
    first = _cli("list", "--limit", "2", "--json")
    assert first.exit_code == 0, first.output
    ids = [json.loads(line)["id"] for line in first.stdout.splitlines()]
    assert ids == ["x2", "x1"]
    cursor = first.stderr.split("--cursor ")[1].strip()
    rest = _cli("list", "--cursor", cursor, "--json")
    assert [json.loads(line)["id"] for line in rest.stdout.splitlines()] == ["x0"]
    assert [json.loads(line)["id"] for line in _cli("list", "--older-than", "1d", "--json").stdout.splitlines()] == [
        "x1",
        "x0",
    ]


def test_a_corrupt_document_is_flagged_not_fatal(sqlite_store) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    with sqlite3.connect(sqlite_store) as raw:
        raw.execute("UPDATE docs SET body = '{broken' WHERE pk = 'x1'")
    out = _cli("list")
    assert out.exit_code == 0, out.output
    assert "x0" in out.output and "x2" in out.output and "CORRUPT" in out.output
    assert "x1: unreadable exec document" in out.output
    shown = _cli("show", "x1")
    assert shown.exit_code == 0, shown.output
    assert "CORRUPT" in shown.output and "not valid JSON" in shown.output
    purged = _cli("purge", "--older-than", "1d", "--yes")
    assert purged.exit_code == 0, purged.output
    assert "purged 1 (1 documents)" in purged.output  # x0; the corrupt one is kept for inspection
    ids = {json.loads(line)["id"] for line in _cli("list", "--json").stdout.splitlines()}
    assert ids == {"x1", "x2"}


def test_configuration_errors_are_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    basic.durable.configure(store="nosuch://somewhere")
    try:
        out = _cli("list")
    finally:
        basic.durable.configure(store=None)
    assert out.exit_code == 1
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1
    assert "ConfigurationError" in out.output and "nosuch" in out.output


def test_ids_with_newlines_keep_the_table_aligned(sqlite_store) -> None:  # type: ignore[no-untyped-def]
    import time

    basic.durable.store.create(
        {"pk": "evil\nid", "id": "exec", "workflow": "w", "status": "running", "created_at": time.time()}
    )
    out = _cli("list")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any(line.startswith("evil\\nid ") for line in lines) and len(lines) == 2 + 4


def test_search_attributes_and_memo_on_real_workers(cluster) -> None:  # type: ignore[no-untyped-def]
    """Issue 13 item 5: attributes at start, upserted by the workflow on a worker, listed from
    Python and the CLI; the memo shown by poll() and `durable show`, never searched."""
    cluster.start_worker()
    a = basic.tagged.options(search={"customer": "c-42", "priority": 3}, memo={"by": "ana"}).start("a")
    b = basic.tagged.start("b", _search={"customer": "c-7", "priority": 3})
    for h in (a, b):  # the first drive ran on the worker: its upsert is recorded
        for _ in range(300):
            if h.poll().search.get("stage") == "waiting":
                break
            time.sleep(0.1)
    assert a.poll().search == {"customer": "c-42", "priority": 3, "stage": "waiting"}
    assert a.poll().memo == {"by": "ana"}
    basic.durable.signal(a.id, "go", "express")
    assert a.result(timeout=60) == "express"
    assert a.poll().search["tags"] == ["done", "a"]

    page = basic.durable.list_executions(search={"priority": 3}, workflow="tagged")
    assert [e.id for e in page.executions] == [b.id, a.id]
    assert [e.id for e in basic.durable.list_executions(search={"tags": "done"}).executions] == [a.id]
    assert basic.durable.list_executions(search={"by": "ana"}).executions == ()  # the memo is not indexed

    out = _cli("list", "--search", "customer=c-42", "--search", "stage=express", "--json")
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["id"] for line in out.output.splitlines()] == [a.id]
    table = _cli("list", "--search", "priority=3", "--status", "running", "--since", "1h")
    assert table.exit_code == 0 and b.id in table.output and a.id not in table.output and "SEARCH" in table.output
    bad = _cli("list", "--search", "not a pair")
    assert bad.exit_code != 0 and "attr=value" in bad.output
    shown = _cli("show", a.id)
    assert 'memo       {"by": "ana"}' in shown.output and '"customer": "c-42"' in shown.output
