"""`celery -A … durable` on the edges: corrupt documents, configuration errors, undeclared
signals, batched purges with progress, rich tables with hostile ids. No worker: click's runner
against a SQLite (or memory) store seeded by hand."""

from __future__ import annotations

import importlib.util
import io
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.cli import render as cli_render
from celery_durable.stores.memory import MemoryStore
from tests.apps import basic

REPO = Path(__file__).resolve().parents[2]
DAY = 86400.0


def _cli(*args: str, input: str | None = None) -> Result:  # noqa: A002
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args], input=input)


def _exec(pk: str, **fields: Any) -> dict[str, Any]:
    ago = time.time() - 10 * DAY
    doc = {"pk": pk, "id": "exec", "type": "exec", "workflow": "sum_chain", "status": "completed", "steps": 0,
           "run": 0, "created_at": ago, "updated_at": ago, "completed_at": ago}  # fmt: skip
    return doc | fields


def _step(pk: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"pk": pk, "id": f"s:{seq:06d}", "type": "step", "run": 0, "seq": seq, "kind": "activity",
            "name": "tests.apps.basic.add", "created_at": time.time() - 10 * DAY} | fields  # fmt: skip


def _result(pk: str, seq: int) -> dict[str, Any]:
    return {"pk": pk, "id": f"r:{seq:06d}", "type": "result", "run": 0, "seq": seq, "ok": True, "value": seq,
            "completed_at": time.time() - 10 * DAY}  # fmt: skip


@pytest.fixture
def db(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The test app on a fresh SQLite store; yields a function running raw SQL on its file."""
    path = tmp_path / "edges.db"
    basic.durable.configure(store=f"sqlite:///{path}")
    basic.durable.store  # noqa: B018 - creates the schema

    def raw(sql: str, *params: Any) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(sql, params)

    yield raw
    basic.durable.configure(store=None)


@pytest.fixture
def memory():  # type: ignore[no-untyped-def]
    store = MemoryStore()
    basic.durable.configure(store=store)
    yield store
    basic.durable.configure(store=None)


def _rows(out: str) -> list[str]:
    """Table rows: the lines after the header's rule, up to the first blank line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"}) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.startswith(" "):  # notes after the table are indented
            break
        rows.append(line)
    return rows


# --- corrupt documents ------------------------------------------------------------------------


def test_every_kind_of_corrupt_exec_document_is_a_flagged_row(db) -> None:  # type: ignore[no-untyped-def]
    store = basic.durable.store
    store.create(_exec("good"))
    store.create(_exec("no-workflow", workflow=None))
    store.create(_exec("wrong-types", workflow=5, status=["x"], created_at="yesterday", steps="many"))
    store.create(_exec("no-status"))
    db("UPDATE docs SET body = json_remove(body, '$.status') WHERE pk = 'no-status'")
    store.create(_exec("not-json"))
    db("UPDATE docs SET body = '{broken' WHERE pk = 'not-json'")
    out = _cli("list")
    assert out.exit_code == 0, out.output
    rows = {r.split()[0]: r for r in _rows(out.stdout)}
    assert set(rows) == {"good", "no-workflow", "wrong-types", "no-status", "not-json"}
    assert "completed" in rows["good"] and "CORRUPT" not in rows["good"]
    assert all("CORRUPT" in rows[k] for k in rows if k != "good")
    assert "wrong-types: unreadable exec document: workflow is not a string" in out.stdout
    assert "not-json: unreadable exec document" in out.stdout and "not valid JSON" in out.stdout
    lines = [json.loads(line) for line in _cli("list", "--json").stdout.splitlines()]
    assert {d["id"]: bool(d["corrupt"]) for d in lines} == {k: k != "good" for k in rows}


def test_out_of_range_timestamps_are_shown_not_fatal(db) -> None:  # type: ignore[no-untyped-def]
    """Failed before: OverflowError out of `list` and `show` (a traceback)."""
    store = basic.durable.store
    store.create(_exec("huge", created_at=1e30, status="failed", steps=1))
    store.create(_step("huge", 1, created_at=-1e300))
    store.create(_exec("nan", steps=0))
    # NaN is what Python's json module writes for float("nan"): a body another writer may leave
    db("""UPDATE docs SET body = json_set(body, '$.updated_at', 'x') WHERE pk = 'nan'""")
    db("""UPDATE docs SET body = replace(body, '"updated_at":"x"', '"updated_at":NaN') WHERE pk = 'nan'""")
    out = _cli("list")
    assert out.exit_code == 0, out.output
    assert "invalid (1e+30)" in out.stdout and "invalid (nan)" in out.stdout
    shown = _cli("show", "huge")
    assert shown.exit_code == 0, shown.output
    assert "invalid (1e+30)" in shown.stdout and "invalid (-1e+300)" in shown.stdout
    assert _cli("show", "nan").exit_code == 0


def test_purge_keeps_an_undecodable_partition_and_purges_the_rest(db) -> None:  # type: ignore[no-untyped-def]
    """Failed before: the first undecodable document ended the purge (exit 1, the rest kept)."""
    store = basic.durable.store
    for pk in ("a", "broken", "c"):
        store.create(_exec(pk, steps=1))
        store.create(_step(pk, 1))
    db("UPDATE docs SET body = '[1,' WHERE pk = 'broken' AND id = 's:000001'")
    store.create(_exec("bad-exec"))
    db("UPDATE docs SET body = json_set(body, '$.workflow', 7) WHERE pk = 'bad-exec'")
    out = _cli("purge", "--older-than", "1d", "--yes")
    assert out.exit_code == 0, out.output
    assert "purged 2 (4 documents)" in out.stdout
    assert "broken: a document cannot be decoded" in out.stdout and "s:000001" in out.stdout
    assert "bad-exec: unreadable exec document" in out.stdout
    left = {json.loads(line)["id"] for line in _cli("list", "--json").stdout.splitlines()}
    assert left == {"broken", "bad-exec"}


def test_show_reads_around_an_undecodable_step(db) -> None:  # type: ignore[no-untyped-def]
    """Failed before: one undecodable document hid the whole timeline ("no steps yet")."""
    store = basic.durable.store
    store.create(_exec("x", steps=3, status="failed"))
    for seq in (1, 2, 3):
        store.create(_step("x", seq))
    store.create(_result("x", 1))
    store.create(_result("x", 3))
    db("UPDATE docs SET body = '{oops' WHERE pk = 'x' AND id = 's:000002'")
    out = _cli("show", "x")
    assert out.exit_code == 0, out.output
    rows = _rows(out.stdout)
    assert [r.split()[0] for r in rows] == ["1", "2", "3"], out.stdout
    assert "ok" in rows[0] and "corrupt" in rows[1] and "ok" in rows[2]
    assert "CORRUPT" in out.stdout and "'s:000002'" in out.stdout and "not valid JSON" in out.stdout
    data = json.loads(_cli("show", "x", "--json").stdout)
    assert [s["state"] for s in data["steps"]] == ["ok", "corrupt", "ok"]


def test_show_flags_a_malformed_step_of_a_memory_store(memory) -> None:  # type: ignore[no-untyped-def]
    memory.create(_exec("m", steps=2, status="failed"))
    memory.create(_step("m", 1))
    memory.create(_step("m", 2, kind=3, name=None) | {"seq": "two"})
    out = _cli("show", "m")
    assert out.exit_code == 0, out.output
    assert "malformed step document" in out.stdout and "corrupt" in out.stdout


# --- configuration errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nosuch://x", "ConfigurationError: unknown store URL scheme 'nosuch'"),
        ("sqlite:////nonexistent-dir/sub/x.db", "StoreUnavailable"),
        ("cosmos://127.0.0.1:1/?key=YWJjZA==&database=d&container=c", "StoreUnavailable"),
    ],
)
def test_configuration_errors_are_one_line_on_stderr(url: str, expected: str) -> None:
    basic.durable.configure(store=url)
    try:
        out = _cli("list")
    finally:
        basic.durable.configure(store=None)
    assert out.exit_code == 1
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr


def test_an_os_error_of_the_store_is_one_line(memory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Failed before: an OSError (disk, socket) out of a store printed a traceback."""

    def broken(*_: Any, **__: Any) -> Any:
        raise PermissionError(13, "Permission denied", "/var/lib/durable.db")

    monkeypatch.setattr(memory, "list_execs", broken)
    out = _cli("list")
    assert out.exit_code == 1
    assert "PermissionError" in out.stderr and "Permission denied" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# --- signals --------------------------------------------------------------------------------------


def test_an_undeclared_signal_is_refused_like_a_handle_refuses_it(db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from celery_durable import PayloadValidationError

    store = basic.durable.store
    store.create(_exec("wait", workflow="approval", status="running", signals=["approval"]))
    sent: list[str] = []
    monkeypatch.setattr(basic.durable.engine.dispatcher, "send_drive", sent.append)
    with pytest.raises(PayloadValidationError, match="declares no signal 'aproval'"):
        basic.durable.handle("wait").signal("aproval", {"ok": True, "by": "x"})
    out = _cli("signal", "wait", "aproval", '{"ok": true, "by": "x"}')
    assert out.exit_code == 1 and out.stdout == "", out.output
    assert "declares no signal 'aproval' (declared: approval)" in out.stderr
    good = _cli("signal", "wait", "approval", '{"ok": true, "by": "x"}')
    assert good.exit_code == 0 and good.stdout.strip() == "delivered" and sent == ["wait"]


def test_a_signal_to_a_workflow_declaring_none_says_where_it_waits(db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Such a workflow takes any name (typed by its wait_signal): delivered, with a note saying
    so. Failed before: a bare "delivered" whatever the (mistyped) name."""
    basic.durable.store.create(_exec("any", status="running", signals=[]))
    monkeypatch.setattr(basic.durable.engine.dispatcher, "send_drive", lambda _id: None)
    out = _cli("signal", "any", "anything", "1")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("delivered")
    assert "declares no signals" in out.stderr and "wait_signal('anything')" in out.stderr


# --- purge: batches per partition, progress -----------------------------------------------------


def test_purge_batches_each_partition_and_shows_progress_on_a_terminal(db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Failed before: no rich progress bar (click's, unpatchable, on the real stdout only)."""
    store = basic.durable.store
    for pk in ("big", "small"):
        store.create(_exec(pk, steps=120 if pk == "big" else 1))
    for seq in range(1, 121):
        store.create(_step("big", seq))
        store.create(_result("big", seq))
    store.create(_step("small", 1))
    batches: list[tuple[str, int]] = []
    real = store.batch

    def counting(pk: str, ops: Any) -> Any:
        batches.append((pk, len(ops)))
        return real(pk, ops)

    monkeypatch.setattr(store, "batch", counting)
    monkeypatch.setattr(cli_render, "is_terminal", lambda stream=None: True)
    out = _cli("purge", "--older-than", "1d", "--yes")
    assert out.exit_code == 0, out.output
    assert "purged 2 (243 documents)" in out.stdout
    assert "purging" in out.stdout and "2/2" in out.stdout
    # 241 documents of "big" in ceil(241 / 100) all-or-nothing batches; one for "small"
    # "big": 240 documents and its exec in 3 all-or-nothing batches (98 deletes + the purge's record
    # + the exec marked purging, then 99 + the exec, then the last 43 and the exec), newest first;
    # "small": its step, its purge record and its exec in one
    assert batches == [("small", 3), ("big", 100), ("big", 100), ("big", 44)]
    assert store.max_batch_ops == 100


def test_purge_records_the_reason_given(db) -> None:  # type: ignore[no-untyped-def]
    """Failed before: ``durable purge`` had no --reason (issue 23: every action says why)."""
    store = basic.durable.store
    store.create(_exec("gdpr"))
    store.create(_step("gdpr", 1))
    out = _cli("purge", "--older-than", "1d", "--yes", "--reason", "erasure request #77")
    assert out.exit_code == 0, out.output
    gone = store.read("gdpr", "purged")
    assert gone is not None and gone["reason"] == "erasure request #77" and gone["documents"] == 2, gone
    assert store.read("gdpr", "exec") is None


# --- tables -----------------------------------------------------------------------------------------


HOSTILE = ["evil\nid", "tab\there", "esc\x1b[31mred", "[bold]markup[/bold]"]


def test_hostile_ids_are_escaped_and_rows_stay_rows(db) -> None:  # type: ignore[no-untyped-def]
    store = basic.durable.store
    for pk in HOSTILE:
        store.create(_exec(pk, status="running"))
    out = _cli("list")
    assert out.exit_code == 0, out.output
    rows = _rows(out.stdout)
    assert len(rows) == len(HOSTILE), out.stdout
    firsts = {r.split("  ")[0] for r in rows}
    assert firsts == {"evil\\nid", "tab\\there", "esc\\x1b[31mred", "[bold]markup[/bold]"}
    assert "\x1b" not in out.stdout and "\t" not in out.stdout
    shown = _cli("show", "evil\nid")
    assert shown.exit_code == 0 and "execution  evil\\nid" in shown.stdout


def test_bench_and_example_tables_use_the_same_rendering(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Failed before: hand-aligned columns, a newline in a cell broke the row."""
    spec = importlib.util.spec_from_file_location("bench_common", REPO / "bench" / "_common.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_common", bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    buf = io.StringIO()
    bench.print_table(["variant", "ms"], [["a\nb", 1.5], ["plain", 22.25]], title="t", stream=buf)
    text = buf.getvalue()
    assert "a\\nb" in text and "─" in text and len(_rows(text)) == 2

    from example_project.__main__ import table

    text = table([["order", "scenario"], ["SO\n1", "standard"], ["SO-2", "x"]])
    assert "SO\\n1" in text and "─" in text and len(_rows(text)) == 2
