"""Updates, signal-with-start and update-with-start on every store (issue 27 §4): an update is
answered, a rejected one leaves no step; a with-start creates the execution and its first
signal or update request in one batch, or reaches the running one; callers racing on one id
make one execution and every value is recorded."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, ExecutionEndedError, UpdateRejectedError
from celery_durable import workflow as wf
from celery_durable.engine.documents.update_docs import update_outcome_id
from celery_durable.engine.starts import with_start
from celery_durable.stores.base import Store
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("update-store-tests", set_as_current=False), store="memory://")
CALLERS = 6


@durable.workflow(name="updst.tally", signals={"add": int, "stop": bool})
def tally(start: int) -> dict[str, Any]:
    total = [start]

    @wf.update("bump", validator=lambda by: None if by > 0 else (_ for _ in ()).throw(ValueError("by > 0")))
    def bump(by: int) -> int:
        total[0] += by
        return total[0]

    got = []
    while True:
        name, value = wf.wait_any("add", "stop")
        if name == "stop":
            return {"total": total[0], "signals": got}
        got.append(value)


def _env(store: Store) -> WorkflowEnvironment:
    return WorkflowEnvironment(durable, store=store)


def _steps(store: Store, eid: str) -> list[str]:
    return [str(d["kind"]) for d in store.query_partition(eid).docs if d.get("type") == "step"]


def test_an_update_is_answered_and_a_rejected_one_leaves_no_step(store: Store) -> None:
    env = _env(store)
    h = env.start(tally, 10, _workflow_id="tally-1")
    assert env.update(h, "bump", 5) == 15
    before = _steps(store, "tally-1")
    with pytest.raises(UpdateRejectedError, match="by > 0"):
        env.update(h, "bump", -1)
    assert _steps(store, "tally-1") == before
    env.signal(h, "stop", True)
    assert h.result() == {"total": 15, "signals": []}


def test_signal_with_start_creates_the_execution_with_its_signal_or_signals_the_running_one(store: Store) -> None:
    env = _env(store)
    opts = tally.options(workflow_id="tally-2")
    h = opts.signal_with_start_on(env.engine, "add", 1, (0,), {})
    exec_doc = store.read("tally-2", "exec")
    assert exec_doc is not None and exec_doc["signal_seq"] == 1  # created with its value, one batch
    assert store.read("tally-2", "sgv:000001") is not None
    env.run_until_idle()
    env.signal_with_start(opts, "add", 2, 0)  # it runs: just signalled (its arguments unused)
    env.signal(h, "stop", True)
    assert h.result() == {"total": 0, "signals": [1, 2]}
    with pytest.raises(ExecutionEndedError, match="has ended"):
        env.signal_with_start(opts, "add", 3, 0)


def test_update_with_start_starts_and_answers_or_updates_the_running_one(store: Store) -> None:
    env = _env(store)
    opts = tally.options(workflow_id="tally-3")
    h, answer = env.update_with_start(opts, "bump", (2,), args=(40,))
    assert answer == 42 and store.read("tally-3", "exec")["update_seq"] == 1  # type: ignore[index]
    assert env.update_with_start(opts, "bump", (1,), args=(0,))[1] == 43  # it runs: updated
    again = tally.options(workflow_id="tally-3b")
    first = env.update_with_start(again, "bump", (1,), args=(0,), update_id="u-1")[1]
    assert first == env.update_with_start(again, "bump", (1,), args=(0,), update_id="u-1")[1] == 1  # resent: found
    assert store.read("tally-3b", "exec")["update_seq"] == 1  # type: ignore[index]
    with pytest.raises(TypeError, match="update_args is a list or tuple"):
        env.update_with_start(opts, "bump", "1")  # type: ignore[arg-type]
    env.signal(h, "stop", True)
    assert h.result() == {"total": 43, "signals": []}


def _race(target: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    gate = threading.Barrier(CALLERS)

    def call(i: int) -> None:
        try:
            gate.wait(timeout=30)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


def test_racing_signal_with_start_callers_make_one_execution_and_record_every_signal(store: Store) -> None:
    env = _env(store)
    created: list[bool] = []

    def call(i: int) -> None:
        created.append(
            with_start.signal_with_start(env.engine, tally.definition, "tally-race", "add", i, ((0,), {}), {})
        )

    assert _race(call) == []
    assert sorted(created) == [False] * (CALLERS - 1) + [True]  # one created it, the others signalled it
    env.run_until_idle()
    h = env.handle("tally-race")
    env.signal(h, "stop", True)
    assert len(env.list_executions(workflow="updst.tally").executions) == 1
    assert sorted(h.result()["signals"]) == list(range(CALLERS))


def test_racing_update_with_start_callers_make_one_execution_and_each_update_is_applied_once(store: Store) -> None:
    env = _env(store)
    numbers: list[int] = []
    created: list[bool] = []

    def call(i: int) -> None:
        n, made = with_start.update_with_start(
            env.engine, tally.definition, "tally-urace", "bump", (1,), ((0,), {}), {}
        )
        numbers.append(n)
        created.append(made)

    assert _race(call) == [] and created.count(True) == 1
    env.run_until_idle()
    assert sorted(numbers) == list(range(1, CALLERS + 1))
    answers = sorted(env.engine.updates.outcome("tally-urace", n, timeout=0) for n in numbers)
    assert answers == list(range(1, CALLERS + 1))  # each applied once, in request order
    assert all(store.read("tally-urace", update_outcome_id(n)) for n in numbers)
    assert len(env.list_executions(workflow="updst.tally").executions) == 1
