"""``celery -A proj durable schedule …``: an operator lists, shows, pauses, resumes, triggers,
backfills and deletes managed schedules; a schedule declared in code is listed and refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.stores.memory import MemoryStore
from tests.apps import basic


def _cli(*args: str, answer: str | None = None) -> Result:
    return CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args], input=answer)


@pytest.fixture
def memory() -> Iterator[MemoryStore]:
    store = MemoryStore()
    basic.durable.configure(store=store)
    basic.durable.schedules.create("nightly", basic.ticker, "cli", cron="0 3 * * *", tz="Europe/Paris")
    yield store
    basic.durable.configure(store=None)


def test_list_shows_managed_schedules_with_their_state(memory: MemoryStore) -> None:
    out = _cli("schedule", "list")
    assert out.exit_code == 0, out.output
    assert "nightly" in out.output and "cron 0 3 * * * (Europe/Paris)" in out.output and "skip" in out.output
    rows = [json.loads(line) for line in _cli("schedule", "list", "--json").output.splitlines()]
    nightly = next(r for r in rows if r["name"] == "nightly")
    assert nightly["kind"] == "managed" and nightly["paused"] is False
    assert nightly["next_fire_at"].endswith(("Z", "+00:00"))  # a time, as ISO


def test_pause_resume_trigger_and_show(memory: MemoryStore) -> None:
    out = _cli("schedule", "pause", "nightly", "--reason", "freeze")
    assert out.exit_code == 0 and "paused" in out.output, out.output
    assert "already paused" in _cli("schedule", "pause", "nightly").output
    shown = json.loads(_cli("schedule", "show", "nightly", "--json").output)
    assert shown["paused"] is True and shown["paused_reason"] == "freeze"
    assert [a["action"] for a in shown["actions"]] == ["create", "pause"]
    out = _cli("schedule", "trigger", "nightly", "--json")
    started = json.loads(out.output)["result"]
    assert started.startswith("nightly@") and memory.read(started, EXEC_ID) is not None
    assert "resumed" in _cli("schedule", "resume", "nightly").output
    text = _cli("schedule", "show", "nightly").output
    assert "paused            no" in text and started in text


def test_backfill_starts_the_ticks_of_a_range(memory: MemoryStore) -> None:
    out = _cli(
        "schedule", "backfill", "nightly", "2026-01-01T00:00:00+00:00", "2026-01-04T00:00:00+00:00",
        "--overlap", "allow_all",
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "3 started" in out.output and "nightly@20260101T020000" in out.output  # 03:00 in Paris, winter
    bad = _cli("schedule", "backfill", "nightly", "2026-01-01T00:00:00", "2026-01-02T00:00:00+00:00")
    assert bad.exit_code != 0 and "UTC offset" in bad.output


def test_delete_asks_and_unknown_names_are_clear_errors(memory: MemoryStore) -> None:
    assert _cli("schedule", "delete", "nightly", answer="n\n").exit_code != 0
    assert basic.durable.schedules.get("nightly") is not None
    assert _cli("schedule", "delete", "nightly", "--json").exit_code != 0  # a script says --yes
    out = _cli("schedule", "delete", "nightly", "--yes")
    assert out.exit_code == 0 and "deleted" in out.output
    for args in (["show", "nightly"], ["pause", "nightly"], ["trigger", "nightly"]):
        out = _cli("schedule", *args)
        assert out.exit_code != 0 and "no schedule named 'nightly'" in out.output


def test_a_schedule_declared_in_code_is_listed_and_read_only(memory: MemoryStore) -> None:
    basic.durable.schedule("from-code", basic.ticker, timedelta(hours=1), "code")
    try:
        rows = [json.loads(line) for line in _cli("schedule", "list", "--json").output.splitlines()]
        assert {r["name"]: r["kind"] for r in rows} == {"from-code": "code", "nightly": "managed"}
        out = _cli("schedule", "pause", "from-code")
        assert out.exit_code != 0 and "declared in code" in out.output
    finally:
        basic.durable._schedules.clear()
        basic.app.conf.beat_schedule = {}
