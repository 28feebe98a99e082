"""Two beats (or scanners) fire a managed schedule's tick once (issue 27 §1): several firers, each
with its own store handle and engine, race over the same due schedules on SQLite, PostgreSQL and
the Cosmos test server; every tick is decided once and starts one execution, sent once. A firer
killed between its decision and its starts leaves them on the schedule, and the next firing
starts them."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.engine.core import Engine
from celery_durable.engine.dispatcher import InlineDispatcher
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.schedules import manage
from celery_durable.engine.schedules.firing import SCHEDULES_PK, fire_due, schedule_id, tick_execution_id
from celery_durable.settings import Settings
from celery_durable.stores import Store, store_from_url
from celery_durable.testing.env import FakeClock

T0 = 1_800_000_000.0  # a whole minute
TICKS = 12
FIRERS = 4


def _fields(overlap: str) -> dict[str, Any]:
    return {
        "every": 60.0,
        "cron": None,
        "tz": "UTC",
        "start_at": None,
        "end_at": None,
        "overlap": overlap,
        "catchup_window": 3600.0,
        "jitter": 0.0,
        "pause_on_failure": False,
        "workflow": "firers.job",
        "payload": {"args": [], "kwargs": {}},
    }


@pytest.fixture
def handles(shared_store_url: str) -> Iterator[list[Store]]:
    opened = [store_from_url(shared_store_url) for _ in range(FIRERS + 1)]
    yield opened
    for s in opened:
        s.close()


def _engines(handles: list[Store], clock: FakeClock) -> list[Engine]:
    return [Engine(s, InlineDispatcher(), settings=Settings(), clock=clock) for s in handles]


def _race(engines: list[Engine], rounds: int = 3) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def firer(eng: Engine) -> None:
        try:
            for _ in range(rounds):
                barrier.wait(timeout=60)
                fire_due(eng)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=firer, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


def test_racing_firers_start_each_tick_once(handles: list[Store]) -> None:
    clock = FakeClock(T0)
    admin, *firers = _engines(handles, clock)
    for name, overlap in (("every-tick", "allow_all"), ("one-at-a-time", "skip"), ("kept", "buffer_one")):
        manage.create(admin, name, _fields(overlap), "test")
    started: Counter[str] = Counter()
    for eng in firers:
        eng.subscribe(lambda event, **kw: started.update([kw["execution_id"]]) if event == "workflow_started" else None)
    clock.advance(TICKS * 60)  # twelve ticks of each are due
    _race(firers)

    ticks = [tick_execution_id("every-tick", T0 + 60 * i) for i in range(1, TICKS + 1)]
    doc = admin.store.read(SCHEDULES_PK, schedule_id("every-tick"))
    assert doc is not None and doc["counts"] == {"started": TICKS} and doc["starting"] == []
    assert all(admin.store.read(eid, EXEC_ID) is not None for eid in ticks)
    # one creation, one first drive per tick, whoever created it
    drives = Counter(item for eng in firers for kind, item in eng.dispatcher.sent if kind == "drive")  # type: ignore[attr-defined]
    assert {eid: started[eid] for eid in ticks} == dict.fromkeys(ticks, 1)
    assert {eid: drives[eid] for eid in ticks} == dict.fromkeys(ticks, 1)

    # skip: the first due tick starts, the others find it running (no worker drives it here)
    doc = admin.store.read(SCHEDULES_PK, schedule_id("one-at-a-time"))
    assert doc is not None and doc["counts"] == {"started": 1, "skipped": TICKS - 1}
    assert [e for e in started if e.startswith("one-at-a-time@")] == [tick_execution_id("one-at-a-time", T0 + 60)]
    # buffer_one: one started, the latest tick kept, the ones between dropped
    doc = admin.store.read(SCHEDULES_PK, schedule_id("kept"))
    assert doc is not None and doc["counts"] == {"started": 1, "dropped": TICKS - 2}
    assert doc["buffered"] == T0 + 60 * TICKS
    assert sum(n for e, n in started.items() if e.startswith("kept@")) == 1
    assert sum(started.values()) == TICKS + 2


def test_a_firer_killed_between_its_decision_and_its_starts(handles: list[Store]) -> None:
    clock = FakeClock(T0)
    admin, dying, survivor, *_ = _engines(handles, clock)
    manage.create(admin, "crashy", _fields("allow_all"), "test")
    clock.advance(3 * 60)

    def killed(*args: Any, **kwargs: Any) -> bool:
        raise KeyboardInterrupt("the firer's process dies here")

    dying.create_execution = killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        fire_due(dying)
    doc = admin.store.read(SCHEDULES_PK, schedule_id("crashy"))
    assert doc is not None and [s["id"] for s in doc["starting"]] == [
        tick_execution_id("crashy", T0 + 60 * i) for i in (1, 2, 3)
    ]
    assert doc["due_at"] <= clock.now() + 1.0  # due again within a clock interval
    clock.advance(1.0)
    fire_due(survivor)
    doc = admin.store.read(SCHEDULES_PK, schedule_id("crashy"))
    assert doc is not None and doc["starting"] == [] and doc["counts"] == {"started": 3}
    for i in (1, 2, 3):
        assert admin.store.read(tick_execution_id("crashy", T0 + 60 * i), EXEC_ID) is not None
