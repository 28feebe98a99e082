"""Local activities (issue 13, item 4): run in the drive's process, recorded with its commit,
retried by their own options (short backoffs inline, longer ones on a timer)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import ActivityError, ConfigurationError, Durable, durable_activity
from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("local-tests", set_as_current=False)
durable = Durable(app, store="memory://")
calls: list[Any] = []
flaky_left = {"n": 0}


@durable_activity(name="loc.inc", local=True)
def inc(x: int) -> int:
    calls.append(("inc", x))
    return x + 1


@durable_activity(name="loc.flaky", local=True, autoretry_for=(RuntimeError,), max_retries=5, retry_backoff=True)
def flaky(x: int) -> int:
    calls.append(("flaky", x))
    if flaky_left["n"] > 0:
        flaky_left["n"] -= 1
        raise RuntimeError("not yet")
    return x * 10


@durable_activity(name="loc.broken", local=True)
def broken() -> int:
    calls.append(("broken",))
    raise KeyError("nope")


@durable_activity(name="loc.remote")
def remote(x: int) -> int:
    return x - 1


@durable.workflow(name="loc.three")
def three(x: int) -> int:
    return inc(inc(inc(x)))


@durable.workflow(name="loc.mixed")
def mixed(x: int) -> int:
    return inc(remote(inc(x)))


@durable.workflow(name="loc.retry")
def retried(x: int) -> int:
    return flaky(x)


@durable.workflow(name="loc.fails")
def fails() -> str:
    try:
        broken()
    except ActivityError as exc:
        return exc.type_name
    return "?"


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    flaky_left["n"] = 0


def test_three_local_steps_complete_in_one_drive_with_one_commit() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(three, 1)
    assert env.result(h) == 4
    assert calls == [("inc", 1), ("inc", 2), ("inc", 3)]
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["drives"] == 1  # one commit: markers, outcomes and the end
    assert [k for k, _ in env.dispatcher.sent] == ["drive"]  # no activity message at all
    steps = Admin(env.engine).describe(h.id).steps
    assert [(s.kind, s.state, s.task_id) for s in steps] == [("activity", "ok", "local")] * 3


def test_local_and_remote_steps_mix() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(mixed, 5)) == 6
    assert [k for k, _ in env.dispatcher.sent].count("activity") == 1


def test_short_backoffs_retry_inline_with_the_activity_options() -> None:
    env = WorkflowEnvironment(durable)
    flaky_left["n"] = 1  # retry_backoff: 1 s before the 2nd attempt, waited in the drive
    h = env.start(retried, 3)
    assert env.result(h) == 30
    assert calls == [("flaky", 3), ("flaky", 3)]
    (rec,) = Admin(env.engine).describe(h.id).steps
    assert rec.attempts == 2


def test_long_backoffs_fall_back_to_a_timer() -> None:
    env = WorkflowEnvironment(durable)
    flaky_left["n"] = 3  # backoffs 1 s (inline), 2 s (over the inline bound: a timer), 4 s
    h = env.start(retried, 2)
    assert h.status() == "running"
    marker = env.store.read(h.id, "s:000001")
    assert marker is not None and marker["due_kind"] == "clock" and marker["attempts"] >= 2
    assert "not yet" in str(marker["last_error"])
    assert env.result(h) == 20
    assert len(calls) == 4
    marker = env.store.read(h.id, "s:000001")
    assert marker is not None and marker.get("due_kind") is None  # settled with its outcome
    assert env.store.read(h.id, "r:000001")["attempts"] == 4  # type: ignore[index]


def test_a_final_failure_is_the_step_outcome() -> None:
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(fails)) == "KeyError"
    assert calls == [("broken",)]  # not retried: no autoretry_for


def test_a_lost_commit_runs_the_function_again_on_the_next_drive() -> None:
    env = WorkflowEnvironment(durable)
    real = env.engine.driver._apply
    lost = {"n": 1}

    def crash(*args: Any, **kwargs: Any) -> None:
        if lost["n"]:
            lost["n"] -= 1
            raise SystemExit("worker died before its commit")
        real(*args, **kwargs)

    env.engine.driver._apply = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        env.start(three, 1)
    assert calls == [("inc", 1), ("inc", 2), ("inc", 3)]
    (ex,) = [d for d in env.store.query_partition(env.store.list_execs(None, 10, None).docs[0]["pk"]).docs]
    assert ex["status"] == "running"  # nothing recorded: the execution is still due
    env.dispatcher.queue.clear()
    env.engine.drive(ex["pk"])
    assert env.store.read(ex["pk"], "exec")["result"] == 4  # type: ignore[index]
    assert len(calls) == 6  # at least once: the 3 steps ran again


def _one() -> int:
    return 1


def test_local_needs_a_plain_function() -> None:
    with pytest.raises(ConfigurationError, match="plain function"):
        durable_activity(local=True)(app.task(name="loc.task")(_one))
