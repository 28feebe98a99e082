"""Engine unit tests: replay semantics with the in-memory store and an in-process dispatcher."""

from __future__ import annotations

import pytest

from celery_durable import workflow as wf
from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ActivityError, PayloadValidationError
from celery_durable.stores.memory import MemoryStore


class Env:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.dispatcher = InlineDispatcher()
        self.registry = Registry()
        self.engine = Engine(self.store, self.dispatcher, self.registry)
        self.worker = LocalWorker(self.engine, self.dispatcher)

    def activity(self, fn):
        act = self.registry.add_activity(fn.__name__, fn)

        def call(*args, **kwargs):
            ctx = require_context("activity")
            return ctx.call_activity(act.name, act.codec, args, kwargs).result()

        call.s = lambda *a, **k: type("Sig", (), {"task": act.name, "args": a, "kwargs": k})()
        return call

    def run(self, fn, *args, wid=None, **kwargs):
        w = self.registry.add_workflow(fn.__name__, fn)
        eid, _ = self.engine.start(w, args, kwargs, workflow_id=wid)
        self.worker.run()
        return self.engine.read_exec(eid)


@pytest.fixture
def env() -> Env:
    return Env()


def test_sequential_activities_complete_and_run_once(env: Env) -> None:
    calls = []

    @env.activity
    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    def flow(n: int) -> int:
        total = 0
        for i in range(n):
            total = add(total, i)
        return total

    ex = env.run(flow, 5)
    assert ex["status"] == "completed", ex
    assert ex["result"] == sum(range(5))
    assert calls == [(0, 0), (0, 1), (1, 2), (3, 3), (6, 4)]


def test_activity_failure_is_catchable(env: Env) -> None:
    @env.activity
    def boom() -> int:
        raise ValueError("nope")

    def flow() -> str:
        try:
            boom()
        except ActivityError as exc:
            return f"{exc.type_name}:{exc.message}"
        return "unreachable"

    ex = env.run(flow)
    assert ex["status"] == "completed"
    assert ex["result"] == "ValueError:nope"


def test_gather_runs_all_and_keeps_order(env: Env) -> None:
    @env.activity
    def square(x: int) -> int:
        return x * x

    def flow(n: int) -> list[int]:
        return wf.gather(square.s(i) for i in range(n))

    ex = env.run(flow, 7)
    assert ex["result"] == [i * i for i in range(7)]


def test_wide_fan_out_exceeds_one_batch(env: Env) -> None:
    @env.activity
    def ident(x: int) -> int:
        return x

    def flow(n: int) -> int:
        return sum(wf.gather(ident.s(i) for i in range(n)))

    ex = env.run(flow, 250)
    assert ex["status"] == "completed"
    assert ex["result"] == sum(range(250))
    assert len(env.worker.executed) == 250


def test_side_effects_are_recorded_once(env: Env) -> None:
    env.engine.driver.sticky.size = 0  # every drive replays from the top (no live instance resumed)
    seen = []

    @env.activity
    def echo(x: str) -> str:
        return x

    def flow() -> str:
        u = wf.uuid4()
        r = wf.random().randint(0, 10**9)
        seen.append((u, r))
        echo("a")
        return f"{u}:{r}"

    ex = env.run(flow)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert ex["result"] == f"{seen[0][0]}:{seen[0][1]}"


def test_invalid_payload_rejected_in_caller(env: Env) -> None:
    def flow(n: int) -> int:
        return n

    w = env.registry.add_workflow("flow", flow)
    with pytest.raises(PayloadValidationError):
        env.engine.start(w, ("not a number",), {})
    assert env.store.calls.get("create", 0) == 0
    assert env.dispatcher.sent == []


def test_idempotent_start_joins(env: Env) -> None:
    @env.activity
    def one() -> int:
        return 1

    def flow() -> int:
        return one()

    w = env.registry.add_workflow("flow", flow)
    a = env.engine.start(w, (), {}, workflow_id="x")
    b = env.engine.start(w, (), {}, workflow_id="x")
    assert a == ("x", True) and b == ("x", False)
    env.worker.run()
    assert env.worker.executed == [("x", 1, "one")]


def test_nondeterminism_is_detected(env: Env) -> None:
    @env.activity
    def first() -> int:
        return 1

    @env.activity
    def second() -> int:
        return 2

    flag = {"v": True}
    env.engine.driver.sticky.size = 0  # a replay from the top (as in a restarted worker) runs the new code

    def flow() -> int:
        return first() if flag["v"] else second()

    w = env.registry.add_workflow("flow", flow)
    eid, _ = env.engine.start(w, (), {})
    env.dispatcher.run_some(1)  # first drive only: schedules `first`
    flag["v"] = False
    env.worker.run()
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "failed"
    assert ex["error"]["type"] == "NonDeterminismError"
    assert "'first'" in ex["error"]["message"] and "'second'" in ex["error"]["message"]


def test_unknown_workflow_is_kept_and_reported(env: Env) -> None:
    def flow() -> int:
        return 1

    w = env.registry.add_workflow("flow", flow)
    eid, _ = env.engine.start(w, (), {})
    del env.registry.workflows["flow"]
    env.worker.run()
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "running"
    assert "not registered" in ex["last_error"]
    assert ex["due_kind"] == "exec"
    env.registry.workflows["flow"] = w
    env.engine.drive(eid)
    assert env.engine.read_exec(eid)["status"] == "completed"


def test_duplicate_delivery_runs_once(env: Env) -> None:
    @env.activity
    def once() -> int:
        return 42

    def flow() -> int:
        return once()

    w = env.registry.add_workflow("flow", flow)
    eid, _ = env.engine.start(w, (), {})
    env.dispatcher.run_some(1)
    kind, req = env.dispatcher.queue[0]
    env.dispatcher.queue.append((kind, req))  # the broker delivers it twice
    env.worker.run()
    assert env.worker.executed == [(eid, 1, "once")]
    assert env.engine.read_exec(eid)["result"] == 42
