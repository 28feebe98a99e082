"""Signal waits consume values one by one, per wait step (issue 13 item 3: signal channels).

Each wait of ``wf.wait_signal(name)`` consumes the next valid value sent for ``name`` (arrival
order, values not consumed yet; a value sent before the wait is kept; an invalid one is rejected
and the wait goes on); its timeout races only that wait. Moved from ``tests/adversarial``: the
first and last tests failed on the code that kept one decision per run and name (``sig:<name>``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from celery_durable import Durable, DurableTimeoutError
from celery_durable import workflow as wf
from celery_durable.engine import Engine, Registry
from celery_durable.engine.admin.operator import Admin
from celery_durable.stores.base import strip_reserved
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("regress-signal-waits", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="rsw.remind", signals={"approval": str})
def remind() -> str:
    """Wait a day; on timeout, remind (here: nothing) and wait again, this time without a limit."""
    try:
        return "fast: " + wf.wait_signal("approval", timeout=timedelta(days=1))
    except DurableTimeoutError:
        pass
    return "late: " + wf.wait_signal("approval")  # no timeout: only a value ends this wait


@durable.workflow(name="rsw.collect", signals={"item": int})
def collect(n: int) -> list[int]:
    return [wf.wait_signal("item") for _ in range(n)]


@durable.workflow(name="rsw.two_phase")
def two_phase(phase: int) -> str:
    if phase == 0:
        wf.sleep(60)  # run 0 never waits for "go"
        wf.continue_as_new(1)
    return wf.wait_signal("go", str)  # run 1 does


@durable.workflow(name="rsw.then_sleep", signals={"go": str})
def then_sleep() -> str:
    got = wf.wait_signal("go")
    wf.sleep(60)
    return got + "/" + wf.wait_signal("go")


def test_a_wait_without_timeout_after_a_timed_out_wait_takes_the_next_value() -> None:
    """The second wait read the first wait's timeout (``sig:approval``) and raised at once."""
    env = WorkflowEnvironment(durable)
    h = env.start(remind, _workflow_id="adv-remind")
    env.skip_to_next_timer()  # the day passes: the first wait times out
    assert h.status() == "running", f"the second wait ended at once: {h.poll().error}"
    assert env.signal(h, "approval", "ops") is True
    assert env.result(h) == "late: ops"


def test_successive_waits_take_values_in_arrival_order_and_keep_the_rest() -> None:
    env = WorkflowEnvironment(durable)
    wid = "rsw-collect"
    env.engine.start(collect.definition, (2,), {}, workflow_id=wid)  # not driven yet
    for v in (1, 2, 3):  # all sent before the first wait: every one is kept
        assert env.engine.signal(wid, "item", v) is True
    env.run_until_idle()
    h = env.handle(wid)
    assert env.result(h) == [1, 2]
    detail = Admin(env.engine).describe(wid)
    assert [(s.value, s.state) for s in detail.signals] == [(1, "consumed"), (2, "consumed"), (3, "pending")]


def test_an_invalid_value_is_rejected_and_the_same_wait_takes_the_next_one() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(collect, 2)
    sender = Engine(env.engine.store, env.engine.dispatcher, Registry(), clock=env.clock)  # e.g. a webhook
    assert sender.signal(h.id, "item", "not a number") is True  # a sender without the workflow: recorded
    env.run_until_idle()
    assert env.signal(h, "item", 10) is True
    assert env.signal(h, "item", 20) is True
    assert env.result(h) == [10, 20]
    states = [(s.value, s.state) for s in Admin(env.engine).describe(h.id).signals]
    assert states == [("not a number", "rejected"), (10, "consumed"), (20, "consumed")]


def test_a_wait_recorded_before_per_step_decisions_still_finds_its_decision() -> None:
    """An execution recorded by the previous code (a marker without ``decision``, its decision
    stored per name as ``sig:<name>``) replays: the wait reads the old document."""
    env = WorkflowEnvironment(durable)
    h = env.start(then_sleep)
    assert env.signal(h, "go", "a") is True
    env.run_until_idle()
    store = env.engine.store
    marker = store.read(h.id, "s:000001")
    decision = next(d for d in store.query_partition(h.id).docs if d.get("type") == "signal")
    assert marker is not None and marker.get("decision") == decision["id"] != "sig:go"
    # rewrite them as the previous code stored them
    old_marker: dict[str, Any] = {k: v for k, v in strip_reserved(marker).items() if k != "decision"}
    store.replace(old_marker, marker["_etag"])
    store.delete(h.id, decision["id"])
    store.create(strip_reserved(decision) | {"id": "sig:go"})
    env.engine.cache.invalidate(h.id)
    env.skip_to_next_timer()
    assert h.status() == "running", h.poll().error
    assert env.signal(h, "go", "b") is True
    assert env.result(h) == "a/b"


def test_a_carried_over_signal_is_shown_in_the_run_that_consumes_it() -> None:
    """``describe`` listed values by the run they were sent in, so the value the current run
    consumed (carried over from run 0) was missing from its timeline."""
    env = WorkflowEnvironment(durable)
    h = env.start(two_phase, 0, _workflow_id="adv-two-phase")
    assert env.signal(h, "go", "now") is True  # sent while run 0 sleeps
    assert env.result(h) == "now"  # consumed by run 1
    detail = Admin(env.engine).describe(h.id)
    assert detail.summary.run == 1
    assert [(s.name, s.state, s.value) for s in detail.signals] == [("go", "consumed", "now")]
