"""``engine.replay.replay`` is pure: history in, commands out; nothing read, written or sent."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.replay.history import replay
from celery_durable.settings import Settings
from celery_durable.stores.memory import MemoryStore


class Clock:
    t = 1_800_000_000.0

    def now(self) -> float:
        return self.t


def _setup() -> tuple[Engine, LocalWorker, Registry, MemoryStore, Clock]:
    store, registry, clock = MemoryStore(), Registry(), Clock()
    dispatcher = InlineDispatcher()
    engine = Engine(store, dispatcher, registry, clock=clock)
    return engine, LocalWorker(engine, dispatcher), registry, store, clock


def _flow(registry: Registry) -> Any:
    act = registry.add_activity("grow", lambda items: [*items, len(items)])

    def grow(items: list[int]) -> list[int]:
        return require_context("a").call_activity(act.name, act.codec, (items,), {}).result()  # type: ignore[no-any-return]

    def flow(items: list[int]) -> dict[str, Any]:
        first = grow(items)
        first.append(99)  # workflow code mutating a recorded value
        items.clear()  # and its own input
        stamp = wf.now()
        wf.sleep(timedelta(seconds=30))
        second = grow([1])
        return {"first": first, "second": second, "stamp": stamp.timestamp()}

    return registry.add_workflow("pure.flow", flow)


def test_replay_does_no_io_and_leaves_its_history_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, worker, registry, store, clock = _setup()
    definition = _flow(registry)
    eid, _ = engine.start(definition, ([1, 2],), {}, workflow_id="pure-1")
    worker.run()  # first activity done, now suspended on the timer
    docs = {d["id"]: d for d in store.query_partition(eid).docs}
    frozen = copy.deepcopy(docs)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("replay touched the store or the transport")

    for name in ("read", "create", "replace", "upsert", "delete", "batch", "query_partition", "scan_due"):
        monkeypatch.setattr(store, name, no_io)
    for name in ("send_activity", "send_drive", "send_clock", "send_effect"):
        monkeypatch.setattr(engine.dispatcher, name, no_io)

    clock.t += 31  # time has passed, but the timer's outcome is not in the history yet
    first = replay(docs["exec"], docs, definition, registry, clock.now(), Settings())
    again = replay(docs["exec"], docs, definition, registry, clock.now(), Settings())
    assert docs == frozen  # nothing the workflow did changed the history it was given
    assert first.kind == again.kind == "suspended"
    assert first.new_docs == again.new_docs == []  # the sleep was recorded by the first drive
    assert first.sends == []

    docs["r:000003"] = {"pk": eid, "id": "r:000003", "type": "result", "run": 0, "seq": 3, "ok": True, "value": None}
    fired = replay(docs["exec"], docs, definition, registry, clock.now(), Settings())
    assert fired.kind == "suspended"
    assert [type(c) for c in fired.sends] == [ActivityRequest]  # the next step, as a command
    assert [d["id"] for d in fired.new_docs] == ["s:000004"]
    assert fired.sends[0].args == [[1]]


def test_the_driver_commits_then_carries_out_the_commands() -> None:
    engine, worker, registry, store, clock = _setup()
    definition = _flow(registry)
    eid, _ = engine.start(definition, ([1, 2],), {}, workflow_id="pure-2")
    worker.run()
    sent = [item for kind, item in engine.dispatcher.sent if kind != "drive"]  # type: ignore[attr-defined]
    assert [type(s) for s in sent] == [ActivityRequest, ClockRequest]
    # every command refers to a step that was committed before it was sent
    for command in sent:
        assert store.read(eid, f"s:{command.seq:06d}") is not None
    clock.t += 31
    engine.timers.fire_due_clocks()
    worker.run()
    ex = engine.read_exec(eid)
    assert ex["status"] == "completed", ex.get("error")
    assert ex["result"]["first"] == [1, 2, 2, 99] and ex["result"]["second"] == [1, 1]
    recorded = store.read(eid, "r:000001")
    assert recorded is not None and recorded["value"] == [1, 2, 2]  # never the mutated copy
    assert store.read(eid, "exec")["payload"]["args"] == [[1, 2]]  # type: ignore[index]
