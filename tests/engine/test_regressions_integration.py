"""Regressions of issue 12 ("edges"): the Celery integration a user copies from the README.

``@durable_activity`` stacked on ``@shared_task``, activities annotated ``-> NoReturn``,
``async def`` activities, and the test environment applying each activity's own Celery retry
options. In-process: :class:`WorkflowEnvironment`, or eager ``task.apply`` with the step header
(what a worker runs); real workers are in tests/integration/test_activity_forms.py.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from typing import Any, Never, NoReturn

import pytest
from celery import Celery, shared_task

from celery_durable import ActivityError, Durable, NonRetryableError, durable_activity
from celery_durable.glue.durable_activity import DURABLE_HEADER, DurableActivityTask
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment


def _name(what: str) -> str:
    return f"reg12.{what}.{uuid.uuid4().hex[:8]}"


def _app() -> tuple[Celery, Durable]:
    app = Celery(_name("app"), broker="memory://")  # current app: what shared tasks resolve to
    return app, Durable(app, store="memory://")


def _caught(fn: Any) -> Any:
    """A workflow body reporting an activity's failure instead of failing."""

    def body() -> dict[str, Any]:
        try:
            return {"value": fn()}
        except ActivityError as exc:
            return {"type": exc.type_name, "message": exc.message, "attempts": exc.attempts}

    return body


def _apply(durable: Durable, task: Any, eid: str, args: list[Any], workflow: str) -> Any:
    """Run one delivery of step 1 of ``eid`` the way a worker does (eager: retries run at once)."""
    durable.engine.drive(eid)  # step 1 scheduled (its message is not consumed here)
    token = durable.engine.store.read(eid, "s:000001")["token"]  # the marker's, as the message carries it
    return task.apply(args=args, headers={DURABLE_HEADER: {"e": eid, "s": 1, "r": 0, "w": workflow, "t": token}})


# --- 1. @durable_activity stacked on @shared_task ---------------------------------------------


def test_durable_activity_over_shared_task_declares_and_upgrades_every_app() -> None:
    before, _ = _app()
    before.finalize()  # an app finalized before the declaration
    bare_name, opt_name = _name("bare"), _name("opts")

    @durable_activity
    @shared_task(name=bare_name)
    def bare(x: int) -> int:
        return x + 1

    @durable_activity
    @shared_task(name=opt_name, autoretry_for=(ConnectionError,), max_retries=4)
    def with_options(x: int) -> int:
        return x * 2

    after, _ = _app()  # and one created after it
    for app in (before, after):
        assert isinstance(app.tasks[bare_name], DurableActivityTask)
        task = app.tasks[opt_name]
        assert isinstance(task, DurableActivityTask)
        assert task.max_retries == 4 and task.autoretry_for == (ConnectionError,)
        assert NonRetryableError in task.dont_autoretry_for
    assert bare(2) == 3 and with_options(2) == 4  # outside a workflow: a plain task call


def test_declaring_over_shared_task_does_not_finalize_the_current_app() -> None:
    app = Celery(_name("app"), broker="memory://")
    name = _name("lazy")

    @durable_activity
    @shared_task(name=name)
    def lazy(x: int) -> int:
        return x

    assert not app.finalized  # Celery finalizes on first use, never at import
    assert isinstance(app.tasks[name], DurableActivityTask)


def test_shared_task_stacked_activity_runs_in_a_workflow() -> None:
    app, durable = _app()
    name = _name("double")

    @durable_activity
    @shared_task(name=name)
    def double(x: int) -> int:
        return x * 2

    @durable.workflow(name=_name("flow"))
    def flow(x: int) -> int:
        return double(x) + 1  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow, 20)) == 41
    # and the way a worker runs it: the step header, the app's own engine
    h = flow.start(5, _workflow_id="W")
    res = _apply(durable, app.tasks[name], "W", [5], flow.name)
    assert res.state == "SUCCESS", res.traceback
    assert h.poll().status == "completed" and durable.engine.read_exec("W")["result"] == 11


@pytest.mark.parametrize("stack", ["shared_task", "app.task"])
def test_stacked_autoretry_task_does_not_retry_non_retryable(stack: str) -> None:
    app, durable = _app()
    name = _name("refuse")
    runs: list[int] = []
    deco = shared_task if stack == "shared_task" else app.task

    @durable_activity
    @deco(name=name, autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
    def refuse(x: int) -> int:
        runs.append(x)
        raise NonRetryableError("card declined")

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(lambda: refuse(1))()  # type: ignore[no-any-return]

    flow.start(_workflow_id="N")
    res = _apply(durable, app.tasks[name], "N", [1], flow.name)
    assert res.state == "FAILURE", res.traceback  # failed for good: a failed task, not retried
    assert runs == [1]
    assert durable.engine.read_exec("N")["result"] == {
        "type": "NonRetryableError",
        "message": "card declined",
        "attempts": 1,
    }


def test_dont_autoretry_for_given_to_durable_activity_keeps_non_retryable() -> None:
    name = _name("dont")

    @durable_activity(name=name, autoretry_for=(Exception,), dont_autoretry_for=(KeyError,))
    def dont() -> None:
        raise NonRetryableError("no")

    app, _ = _app()
    assert set(app.tasks[name].dont_autoretry_for) >= {KeyError, NonRetryableError}


def test_shared_task_over_durable_activity_fails_loudly_at_declaration() -> None:
    with pytest.raises(TypeError, match="shared_task"):

        @shared_task  # durable_activity already made a shared task: Celery refuses a second
        @durable_activity(name=_name("twice"))
        def twice() -> None: ...


# --- 2. -> NoReturn ------------------------------------------------------------------------


@pytest.mark.parametrize("hint", [NoReturn, Never], ids=["NoReturn", "Never"])
def test_no_return_activity_declares_and_fails_as_activity_error(hint: Any) -> None:
    _, durable = _app()

    def always_fails() -> None:
        raise RuntimeError("boom")

    always_fails.__annotations__["return"] = hint
    act = durable_activity(name=_name("fails"))(always_fails)

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(act)()  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow)) == {"type": "RuntimeError", "message": "boom", "attempts": 1}


def test_no_return_activity_that_returns_fails_clearly() -> None:
    _, durable = _app()

    @durable_activity(name=_name("liar"))
    def liar() -> NoReturn:
        return None  # type: ignore[misc]

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(liar)()  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    out = env.result(env.start(flow))  # recorded as the activity's failure: no hang, no crash
    assert out["attempts"] == 1 and "NoReturn" in out["message"]
    assert out["type"] == "ResultPayloadValidationError", out


# --- 3. async def activities -----------------------------------------------------------------


def _async_activities() -> tuple[Celery, Durable, Any, Any, list[int]]:
    app, durable = _app()
    calls: list[int] = []

    @durable_activity(name=_name("fetch"))
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        calls.append(x)
        return x * 10

    @durable.workflow(name=_name("flow"))
    def flow(x: int) -> int:
        return fetch(x) + fetch(x + 1)

    return app, durable, fetch, flow, calls


def test_async_activity_runs_in_the_environment() -> None:
    _, durable, fetch, flow, calls = _async_activities()
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow, 1)) == 30
    assert calls == [1, 2]
    assert fetch(4) == 40  # outside a workflow: a plain (synchronous) task call


def test_async_activity_runs_when_the_environment_is_driven_from_a_running_loop() -> None:
    _, durable, _, flow, _ = _async_activities()

    async def main() -> int:  # e.g. an async test: asyncio.run() cannot nest, the activity still runs
        env = WorkflowEnvironment(durable)
        return env.result(env.start(flow, 2))  # type: ignore[no-any-return]

    assert asyncio.run(main()) == 50


def test_async_activity_runs_on_the_worker_path() -> None:
    app, durable, fetch, flow, calls = _async_activities()
    flow.start(3, _workflow_id="A")
    res = _apply(durable, app.tasks[fetch.name], "A", [3], flow.name)
    assert res.state == "SUCCESS", res.traceback
    assert calls == [3]
    result = durable.store.read("A", "r:000001")
    assert result is not None and result["ok"] and result["value"] == 30


@pytest.mark.parametrize("stack", ["shared_task", "app.task"])
def test_async_stacked_autoretry_activity_is_retried(stack: str) -> None:
    app, durable = _app()
    name = _name("async_flaky")
    runs: list[int] = []
    deco = shared_task if stack == "shared_task" else app.task

    @durable_activity
    @deco(name=name, autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
    async def flaky(x: int) -> int:
        runs.append(x)
        if len(runs) < 3:
            raise ConnectionError("down")
        return x

    @durable.workflow(name=_name("flow"))
    def flow() -> int:
        return flaky(7)  # type: ignore[no-any-return]

    flow.start(_workflow_id="R")
    res = _apply(durable, app.tasks[name], "R", [7], flow.name)
    assert res.state == "SUCCESS", res.traceback
    assert runs == [7, 7, 7]
    assert durable.engine.read_exec("R")["result"] == 7
    runs.clear()
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow)) == 7 and len(runs) == 3


# --- 4. WorkflowEnvironment applies each activity's Celery retry options ---------------------


def _retry_env(fails: int, **options: Any) -> tuple[WorkflowEnvironment, Any, list[float]]:
    """An activity failing ``fails`` times (``ConnectionError``), in a catching workflow."""
    _, durable = _app()
    at: list[float] = []
    env_box: list[WorkflowEnvironment] = []

    @durable_activity(name=_name("flaky"), **options)
    def flaky() -> str:
        at.append(env_box[0].clock.now())
        if len(at) <= fails:
            raise ConnectionError(f"attempt {len(at)}")
        return f"ok after {len(at)}"

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(flaky)()  # type: ignore[no-any-return]

    env_box.append(WorkflowEnvironment(durable))
    return env_box[0], flow, at


def test_environment_retries_an_autoretry_activity_like_a_worker() -> None:
    env, flow, at = _retry_env(1, autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
    assert env.result(env.start(flow)) == {"value": "ok after 2"}
    assert len(at) == 2


def test_environment_exhausts_max_retries_with_the_workers_attempt_count() -> None:
    env, flow, at = _retry_env(99, autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0)
    out = env.result(env.start(flow))
    assert out == {"type": "ConnectionError", "message": "attempt 3", "attempts": 3}
    assert len(at) == 3


@pytest.mark.parametrize(
    "options",
    [
        {},  # no autoretry_for: a failure is final
        {"autoretry_for": (KeyError,)},  # another error
        {"autoretry_for": (Exception,), "dont_autoretry_for": (ConnectionError,)},
    ],
    ids=["no-autoretry", "other-error", "dont-autoretry"],
)
def test_environment_does_not_retry_what_a_worker_would_not(options: dict[str, Any]) -> None:
    env, flow, at = _retry_env(99, max_retries=5, default_retry_delay=0, **options)
    assert env.result(env.start(flow))["attempts"] == 1
    assert len(at) == 1


def test_environment_never_retries_non_retryable() -> None:
    _, durable = _app()
    runs: list[int] = []

    @durable_activity(name=_name("refuse"), autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
    def refuse() -> None:
        runs.append(1)
        raise NonRetryableError("declined")

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(refuse)()  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow))["attempts"] == 1 and runs == [1]


def test_environment_waits_retry_delays_on_its_fake_clock() -> None:
    env, flow, at = _retry_env(2, autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=30)
    h = env.start(flow)
    assert len(at) == 1 and h.status() == "running"  # the retry is 30 s away, as on a worker
    env.advance(29)
    assert len(at) == 1
    env.advance(1)
    assert len(at) == 2
    assert env.result(h) == {"value": "ok after 3"}  # result() skips to the next retry too
    assert [round(b - a) for a, b in zip(at, at[1:], strict=False)] == [30, 30]


def test_environment_applies_exponential_backoff_without_jitter() -> None:
    env, flow, at = _retry_env(3, autoretry_for=(ConnectionError,), max_retries=5, retry_backoff=2)
    assert env.result(env.start(flow)) == {"value": "ok after 4"}
    assert [round(b - a) for a, b in zip(at, at[1:], strict=False)] == [2, 4, 8]


def test_environment_retries_a_stacked_app_task_by_its_options() -> None:
    app, durable = _app()
    runs: list[int] = []

    @durable_activity
    @app.task(name=_name("stacked"), autoretry_for=(ConnectionError,), max_retries=1, default_retry_delay=0)
    def stacked() -> None:
        runs.append(1)
        raise ConnectionError("down")

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(stacked)()  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow))["attempts"] == 2 and len(runs) == 2


def test_activity_attempts_is_deprecated_and_only_covers_plain_registry_activities() -> None:
    _, durable = _app()
    runs: list[int] = []

    @durable_activity(name=_name("once"))
    def once() -> None:
        runs.append(1)
        raise ConnectionError("down")

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(once)()  # type: ignore[no-any-return]

    with pytest.warns(DeprecationWarning, match="activity_attempts"):
        env = WorkflowEnvironment(durable, activity_attempts=3)
    assert env.result(env.start(flow))["attempts"] == 1  # the task's own options win
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WorkflowEnvironment(durable, store=MemoryStore())  # no warning by default


def test_environment_does_not_retry_an_invalid_result() -> None:
    """On a worker only the function's own errors go through autoretry: the result's encoding
    happens after it, so an invalid result fails at once."""
    _, durable = _app()
    runs: list[int] = []

    @durable_activity(name=_name("bad"), autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
    def bad() -> int:
        runs.append(1)
        return "not a number"  # type: ignore[return-value]

    @durable.workflow(name=_name("flow"))
    def flow() -> dict[str, Any]:
        return _caught(bad)()  # type: ignore[no-any-return]

    env = WorkflowEnvironment(durable)
    assert env.result(env.start(flow))["attempts"] == 1 and runs == [1]
