"""Debounced starts (issue 26 §5: ``options(dedup_key=..., debounce=...)``, engine/starts/debounce.py):
starts with one key within the quiet period make one execution, which runs once, with the latest
input, a full quiet period after the last start; once it runs, a start is an ordinary conflict
with its key. On ``WorkflowEnvironment``'s fake clock, on SQLite (the input apart checked too)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable import DuplicateStart, Durable
from celery_durable import workflow as wf
from celery_durable.engine.documents.schema import EXEC_ID
from celery_durable.engine.starts.deadlines import START_CLOCK
from celery_durable.errors import ConfigurationError
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("debounce-tests", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
RAN: list[Any] = []


@durable.workflow(name="db.reindex")
def reindex(what: str) -> str:
    RAN.append(what)
    wf.sleep(600)  # runs a while: a start meanwhile meets a running holder
    return what


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    RAN.clear()
    return WorkflowEnvironment(durable, store=SqliteStore(str(tmp_path / "db.sqlite")))


def _debounced(what: str, **kw: Any) -> Any:
    return reindex.options(dedup_key="reindex:shop-1", debounce=30, **kw)


def test_starts_within_the_quiet_period_run_once_with_the_latest_input(env: WorkflowEnvironment) -> None:
    first = env.start(_debounced("a"), "a")
    assert first.status() == "scheduled"
    env.advance(10)
    second = env.start(_debounced("b"), "b")
    env.advance(10)
    third = env.start(_debounced("c"), "c")
    assert first.id == second.id == third.id
    env.advance(29)  # 49 s: the last start was 29 s ago
    assert first.status() == "scheduled" and RAN == []
    env.advance(1)  # 50 s: a full quiet period after the last start
    assert first.status() == "running"
    assert RAN == ["c"]
    env.advance(600)
    assert env.result(first) == "c" and RAN == ["c"]


def test_a_start_after_it_began_is_a_conflict_of_its_key(env: WorkflowEnvironment) -> None:
    first = env.start(_debounced("a"), "a")
    env.advance(30)
    assert first.status() == "running"
    with pytest.raises(DuplicateStart) as refused:
        env.start(_debounced("b"), "b")
    assert refused.value.existing == first.id
    joined = env.start(_debounced("b", on_conflict="return-existing"), "b")
    assert joined.id == first.id
    env.advance(600)
    assert env.result(first) == "a" and RAN == ["a"]  # the input it started with


def test_a_large_input_moves_apart_and_back(env: WorkflowEnvironment) -> None:
    big = "x" * 20_000
    h = env.start(_debounced("small"), "small")
    env.start(_debounced("big"), big)
    ex = env.store.read(h.id, EXEC_ID) or {}
    assert "payload_at" in ex and "payload" not in ex  # the large input in a document of its own
    env.start(_debounced("small again"), "small again")
    ex = env.store.read(h.id, EXEC_ID) or {}
    assert ex.get("payload") == {"args": ["small again"], "kwargs": {}} and "payload_at" not in ex
    assert env.store.read(h.id, "input") is None  # the document apart went with it
    env.advance(30)
    assert RAN == ["small again"]


def test_racing_debounced_starts_make_one_execution(env: WorkflowEnvironment) -> None:
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda n: env.start(_debounced(str(n)), str(n)).id, range(8)))
    assert len(set(ids)) == 1
    env.advance(30)
    assert len(RAN) == 1 and RAN[0] in {str(n) for n in range(8)}


def test_the_start_clock_moves_with_the_latest_start(env: WorkflowEnvironment) -> None:
    h = env.start(_debounced("a"), "a")
    started = env.clock.now()
    env.advance(20)
    env.start(_debounced("b"), "b")
    clock = env.store.read(h.id, START_CLOCK) or {}
    assert clock.get("due_at") == pytest.approx(started + 50)
    assert (env.store.read(h.id, EXEC_ID) or {}).get("start_at") == pytest.approx(started + 50)


def test_a_deadline_moves_with_the_start(env: WorkflowEnvironment) -> None:
    h = env.start(_debounced("a", timeout=100), "a")
    first_deadline = (env.store.read(h.id, EXEC_ID) or {}).get("deadline_at")
    env.advance(20)
    env.start(_debounced("b", timeout=100), "b")
    assert (env.store.read(h.id, EXEC_ID) or {}).get("deadline_at") == pytest.approx(first_deadline + 20)
    env.advance(30)  # started at 50 (a scan on time): its deadline is at 150
    env.advance(99)
    assert h.status() == "running"
    env.advance(1.5)  # (not to the float: epoch seconds plus moves round)
    assert h.status() == "timed_out"


@pytest.mark.parametrize(
    "options",
    [
        {"debounce": 30},  # no key
        {"dedup_key": "k", "debounce": 0},
        {"dedup_key": "k", "debounce": -1},
        {"dedup_key": "k", "debounce": float("nan")},
        {"dedup_key": "k", "debounce": "30"},
        {"dedup_key": "k", "debounce": 30, "start_delay": 10},
    ],
)
def test_bad_debounce_options_are_refused_in_the_caller(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        reindex.options(**options)
