"""Batch operations (issue 27 §2, engine/admin/batch.py, glue/batch.py): an action over every
execution a query selects, run as a durable workflow (its progress its custom status), page by
page, refusals counted and named, never acting on itself, rate limited by sleeping between pages,
continuing as new past ``PAGES_PER_RUN`` pages; bad specs fail in the caller."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.errors import ConfigurationError
from celery_durable.glue import batch as batch_glue
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("batch-tests", set_as_current=False), store="memory://")


@durable.workflow(name="bt.waits")
def waits(tag: str) -> str:
    return tag + str(wf.wait_signal("go"))


@durable.workflow(name="bt.quick")
def quick(tag: str) -> str:
    return tag


def _env(n: int = 5) -> WorkflowEnvironment:
    env = WorkflowEnvironment(durable)
    env.durable = durable  # type: ignore[attr-defined]
    for i in range(n):
        env.start(waits, f"w{i}", _workflow_id=f"w{i}")
    env.start(quick, "q", _workflow_id="q0")
    return env


def _batch(env: WorkflowEnvironment, action: str, **spec: object) -> dict[str, object]:
    """Start the batch through the environment's engine (as ``Durable.batch`` does) and run it."""
    from celery_durable.engine.admin.batch import BATCH_WORKFLOW, batch_spec

    query, options = batch_spec(action, by="ops", **spec)  # type: ignore[arg-type]
    definition = env.engine.registry.workflow(BATCH_WORKFLOW)
    assert definition is not None
    eid, _ = env.engine.start(definition, (action, query, options), {})
    env.run_until_idle()
    for _ in range(200):
        if env.engine.read_exec(eid)["status"] != "running":
            break
        env.skip_to_next_timer()
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "completed", ex
    return dict(ex["result"]) | {"id": eid, "custom_status": ex.get("custom_status")}


def test_cancel_every_running_execution_of_a_workflow() -> None:
    env = _env()
    result = _batch(env, "cancel", workflow="bt.waits", status="running", page_size=2)
    assert (result["matched"], result["done"], result["refused"], result["pages"]) == (5, 5, 0, 3)
    assert [env.engine.read_exec(f"w{i}")["status"] for i in range(5)] == ["cancelled"] * 5
    assert env.engine.read_exec("q0")["status"] == "completed"  # not selected
    assert result["custom_status"]["finished"] is True  # type: ignore[index]
    ops = [d for d in env.engine.store.query_partition("w0").docs if d.get("type") == "operation"]
    assert [(o["action"], o["by"]) for o in ops] == [("cancel", f"ops@batch:{result['id']}")]  # who, and which batch


def test_refusals_are_counted_and_named_and_a_batch_never_acts_on_itself() -> None:
    env = _env(3)
    result = _batch(env, "retry")  # every execution: none failed, so each is refused
    assert result["done"] == 0 and result["refused"] == result["matched"] == 4  # 3 waiting + the quick one
    assert all("not failed" in why or "running" in why or "completed" in why for _, why in result["errors"])  # type: ignore[union-attr]
    again = _batch(env, "pause", status="running")
    assert again["done"] == 3  # the first batch (completed) and this one (running) are not touched
    assert all(env.engine.read_exec(f"w{i}").get("paused") for i in range(3))
    unpaused = _batch(env, "unpause", status="running")
    assert unpaused["done"] == 3


def test_signal_and_the_rate_sleeps_between_pages() -> None:
    env = _env(4)
    start = env.clock.now()
    result = _batch(env, "signal", workflow="bt.waits", signal="go", value="!", rate=1.0, page_size=2)
    assert result["done"] == 4
    assert env.clock.now() - start >= 2.0  # 2 executions at 1/s after the first page
    assert [env.engine.read_exec(f"w{i}")["result"] for i in range(4)] == [f"w{i}!" for i in range(4)]


def test_a_long_batch_continues_as_new_keeping_its_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_glue, "PAGES_PER_RUN", 2)
    env = _env(7)
    result = _batch(env, "pause", workflow="bt.waits", page_size=1)
    assert (result["matched"], result["done"], result["pages"]) == (7, 7, 7)
    assert env.engine.read_exec(str(result["id"])).get("run", 0) >= 3


def test_a_bad_batch_fails_in_the_caller() -> None:
    for action, spec, match in (
        ("launch", {}, "one of"),
        ("reset", {}, "step"),
        ("signal", {}, "signal's name"),
        ("cancel", {"rate": 0}, "rate"),
        ("cancel", {"status": "sleeping"}, "unknown status"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            durable.batch(action, **spec)
    with pytest.raises(ConfigurationError, match="page_size"):
        durable.batch("cancel", since=timedelta(days=1), page_size=0)


def test_a_page_acted_on_again_sends_no_signal_twice_and_a_bad_value_is_refused() -> None:
    """A page re-run after a killed worker acts again on what it listed: a signal carries the
    batch's and the target's id, so the second send is found recorded (the workflow gets one
    value); a value of the wrong type for a declared signal is a refusal, not a stored value."""
    from celery_durable.engine.admin.batch import apply_page, batch_spec

    env = _env(2)
    query, options = batch_spec("signal", by="ops", workflow="bt.waits", signal="go", value="!")
    for _ in range(2):  # the same page twice, as a re-run would
        page = apply_page(env.engine, "signal", query, None, options, "batch-x")
        assert page["done"] == 2
    env.run_until_idle()
    values = [d for d in env.engine.store.query_partition("w0").docs if d.get("type") == "signal_value"]
    assert len(values) == 1 and env.engine.read_exec("w0")["result"] == "w0!"


@durable.workflow(name="bt.typed", signals={"n": int})
def typed() -> int:
    return int(wf.wait_signal("n"))


def test_a_signal_of_the_wrong_type_is_refused_per_execution() -> None:
    from celery_durable.engine.admin.batch import apply_page, batch_spec

    env = WorkflowEnvironment(durable)
    env.start(typed, _workflow_id="t0")
    query, options = batch_spec("signal", by="ops", workflow="bt.typed", signal="n", value="not an int")
    page = apply_page(env.engine, "signal", query, None, options, "batch-y")
    assert (page["done"], page["refused"]) == (0, 1) and "PayloadValidationError" in page["errors"][0][1]
