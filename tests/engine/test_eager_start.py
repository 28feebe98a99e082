"""Eager start (``durable_eager_start``): ``start()`` drives the first step in the caller and
sends the first activities itself, one broker hop fewer; it declines anything but scheduling
activities or timers, and then the first drive goes to a worker as usual."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.engine.documents.schema import marker_id
from celery_durable.errors import StoreUnavailable
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("eager-tests", set_as_current=False)
durable = Durable(app, store="memory://", eager_start=True)
calls: list[Any] = []


@durable_activity(name="eager.add")
def add(x: int) -> int:
    calls.append(("add", x))
    return x + 1


@durable_activity(name="eager.local", local=True)
def local_add(x: int) -> int:
    calls.append(("local", x))
    return x + 1


@durable.workflow(name="eager.two")
def two(x: int) -> int:
    return add(add(x))


@durable.workflow(name="eager.local_first")
def local_first(x: int) -> int:
    return add(local_add(x))


@durable.workflow(name="eager.raises")
def raises(x: int) -> int:
    calls.append(("raises", x))
    raise ValueError(f"bad {x}")


@durable.workflow(name="eager.nothing")
def nothing(x: int) -> int:
    return x * 2


@durable.workflow(name="eager.child_first")
def child_first(x: int) -> int:
    return int(two.start_child(x).result())


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


def sent(env: WorkflowEnvironment) -> list[str]:
    return [kind for kind, _ in env.dispatcher.sent]


def begin(env: WorkflowEnvironment, workflow: Any, *args: Any) -> Any:
    """``start()`` alone (``env.start`` would also run the worker)."""
    eid, _ = env.engine.start(workflow.definition, args, {})
    return env.handle(eid)


def test_the_first_activity_is_sent_by_the_caller_without_a_drive_message() -> None:
    env = WorkflowEnvironment(durable)
    h = begin(env, two, 1)
    assert sent(env) == ["activity"]  # no "drive": the caller drove the first step
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["status"] == "running" and ex["steps"] == 1
    assert calls == []  # scheduled, not run: the activity runs on a worker
    assert h.id not in env.engine.driver.sticky.held()  # the caller keeps no live instance
    assert env.result(h) == 3
    assert calls == [("add", 1), ("add", 2)]


def test_off_by_default_the_first_drive_goes_to_a_worker() -> None:
    plain = Durable(Celery("eager-off", set_as_current=False), store="memory://")
    assert plain.settings.eager_start is False
    env = WorkflowEnvironment(plain)
    env.engine.registry = durable.registry  # the same workflows, without eager start
    h = begin(env, two, 1)
    assert sent(env) == ["drive"]
    assert env.result(h) == 3


def test_a_local_activity_first_is_left_to_the_worker_and_runs_once() -> None:
    env = WorkflowEnvironment(durable)
    h = begin(env, local_first, 1)
    assert sent(env) == ["drive"]  # declined: a local activity runs on a worker, not in the caller
    assert calls == []
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["steps"] == 0 and not ex.get("drives")  # nothing committed here
    assert env.result(h) == 3
    assert calls == [("local", 1), ("add", 2)]


def test_a_workflow_failing_at_once_is_failed_by_the_worker_not_the_caller() -> None:
    env = WorkflowEnvironment(durable)
    h = begin(env, raises, 7)
    assert sent(env) == ["drive"]
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["status"] == "running"  # the caller recorded no failure
    env.run_until_idle()
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["status"] == "failed" and "bad 7" in ex["error"]["message"]


@pytest.mark.parametrize("workflow", [nothing, child_first], ids=["completes", "starts-a-child"])
def test_an_end_or_a_child_first_is_left_to_the_worker(workflow: Any) -> None:
    env = WorkflowEnvironment(durable)
    h = begin(env, workflow, 2)
    assert sent(env) == ["drive"]
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["status"] == "running" and ex["steps"] == 0
    assert env.result(h) == 4


def test_a_store_outage_in_the_eager_drive_falls_back_to_the_drive_message() -> None:
    env = WorkflowEnvironment(durable)
    batch = env.engine.store.batch

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("down for the test")

    env.engine.store.batch = down  # type: ignore[method-assign]
    try:
        h = begin(env, two, 1)
    finally:
        env.engine.store.batch = batch  # type: ignore[method-assign]
    assert sent(env) == ["drive"]
    # review: the replay had parked the workflow; a web process must not keep its greenlet
    assert env.engine.driver.sticky.held() == []
    assert env.result(h) == 3
    assert calls == [("add", 1), ("add", 2)]


def test_documents_left_in_the_partition_are_seen_as_by_a_worker() -> None:
    """The eager drive's first round reads nothing (it knows the exec it just created); a step
    document already there (an earlier life of the id) makes its commit conflict, and the next
    round reads the partition: the outcome is the one a worker's first drive reaches."""
    outcomes = []
    for eager in (False, True):
        env = WorkflowEnvironment(durable)
        env.engine.settings = dataclasses.replace(env.engine.settings, eager_start=eager)
        stray = {"pk": "left", "id": marker_id(1), "type": "marker", "kind": "activity", "seq": 1, "name": "other"}
        env.store.create(stray)
        eid, _ = env.engine.start(two.definition, (1,), {}, workflow_id="left")
        assert sent(env)[:1] == ["drive"]  # the eager drive conflicted, then declined what it read
        env.run_until_idle()
        ex = env.store.read(eid, "exec")
        assert ex is not None
        outcomes.append((ex["status"], (ex.get("error") or {}).get("type")))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] != "running", outcomes
