"""``@durable_activity(pause_on_failure=True)`` (issue 27 §2): an activity that fails for good pauses
its execution instead of failing the step — the error kept on the step, the pause recorded with
it as the reason — and the unpause runs the step again (after a fix), the workflow going on as if
it had never failed; an activity without the option fails its step as before."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_durable import ActivityError, Durable, durable_activity
from celery_durable.errors import ConfigurationError
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("pof-tests", set_as_current=False), store="memory://")
BROKEN = {"on": True}


@durable_activity(name="pof.charge", pause_on_failure=True)
def charge(cents: int) -> str:
    if BROKEN["on"]:
        raise ConnectionRefusedError("the payment service is down")
    return f"charged {cents}"


@durable_activity(name="pof.plain")
def plain(cents: int) -> str:
    raise ValueError("no")


@durable.workflow(name="pof.order")
def order(cents: int) -> str:
    return charge(cents) + "!"


@durable.workflow(name="pof.order_plain")
def order_plain(cents: int) -> str:
    try:
        return plain(cents)
    except ActivityError as exc:
        return f"failed: {exc.type_name}"


def test_a_failure_pauses_and_the_unpause_runs_the_step_again() -> None:
    BROKEN["on"] = True
    env = WorkflowEnvironment(durable)
    h = env.start(order, 5, _workflow_id="pof-1")
    ex = env.engine.read_exec("pof-1")
    assert ex["status"] == "running" and ex.get("paused")
    marker = next(d for d in env.engine.store.query_partition("pof-1").docs if d.get("kind") == "activity")
    assert marker["held"] and "payment service is down" in marker["last_error"]["message"]
    assert not any(d.get("type") == "result" for d in env.engine.store.query_partition("pof-1").docs)
    ops = [d for d in env.engine.store.query_partition("pof-1").docs if d.get("type") == "operation"]
    assert [(o["action"], o["by"]) for o in ops] == [("pause", "pause_on_failure")]
    assert "ConnectionRefusedError" in str(ops[0]["reason"])
    BROKEN["on"] = False  # the fix
    from celery_durable.engine.admin.pause import unpause

    assert unpause(env.engine, "pof-1", "ops")
    env.run_until_idle()
    assert h.status() == "completed" and h.result() == "charged 5!"


def test_without_the_option_the_step_fails_as_before() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(order_plain, 1, _workflow_id="pof-2")
    assert h.result() == "failed: ValueError" and not env.engine.read_exec("pof-2").get("paused")


def test_the_option_is_checked_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match="pause_on_failure"):
        durable_activity(name="pof.bad", pause_on_failure="yes")(lambda: None)
    with pytest.raises(ConfigurationError, match="local"):
        durable_activity(name="pof.local", local=True, pause_on_failure=True)(lambda: None)
