"""``activity.publish(topic, value)`` (issue 27 §4, engine/activities/publish.py): a running
activity appends to its execution's stream; the replay takes each value in at its next wait point
as a ``publish`` step, so readers see one stable order (the history's), a retried attempt's values
come again tagged with their attempt, and a value published outside an attempt is refused."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, activity, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.replay.check import check_history
from celery_durable.errors import DurableError, DurableTimeoutError
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("apub-tests", set_as_current=False), store="memory://")
FAILS: dict[str, int] = {}


@durable_activity(name="apub.work", autoretry_for=(RuntimeError,), max_retries=2, default_retry_delay=0)
def work(key: str, n: int) -> int:
    for i in range(n):
        activity.publish("progress", {"i": i, "attempt": activity.info().attempt})
    if FAILS.get(key, 0) > 0:
        FAILS[key] -= 1
        raise RuntimeError("try again")
    return n


@durable.workflow(name="apub.flow")
def flow(key: str, n: int) -> int:
    wf.publish("progress", "start")
    total = work(key, n)
    wf.publish("progress", "end")
    wf.wait_signal("stop")
    return total


def _publish_steps(env: WorkflowEnvironment, eid: str) -> list[dict[str, Any]]:
    docs = [d for d in env.store.query_partition(eid).docs if d.get("kind") == "publish"]
    return sorted(docs, key=lambda d: int(d["seq"]))


def test_an_activitys_values_join_the_stream_in_one_stable_order() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(flow, "a", 3, _workflow_id="apub-1")
    live = []
    with pytest.raises(DurableTimeoutError):  # it waits for "stop": the reader follows it live
        for value in h.stream("progress", timeout=0.05):
            live.append(value)
    assert len(live) == 5  # the activity's values are in while the workflow still runs
    env.signal(h, "stop", True)
    assert h.result() == 3
    values = list(h.stream("progress"))
    assert values == ["start", {"i": 0, "attempt": 1}, {"i": 1, "attempt": 1}, {"i": 2, "attempt": 1}, "end"]
    steps = _publish_steps(env, "apub-1")
    assert [s.get("from_step") for s in steps] == [None, 2, 2, 2, None]  # the activity's step
    docs = {d["id"]: d for d in env.store.query_partition("apub-1").docs}
    assert check_history(docs, durable.registry, durable.settings, env.clock.now()).ok  # replays alike


def test_a_retried_attempt_publishes_again_each_value_tagged_with_its_attempt() -> None:
    FAILS["b"] = 1
    env = WorkflowEnvironment(durable)
    h = env.start(flow, "b", 2, _workflow_id="apub-2")
    env.signal(h, "stop", True)
    assert h.result() == 2
    values = list(h.stream("progress"))
    assert values[0] == "start" and values[-1] == "end"
    assert sorted((v["attempt"], v["i"]) for v in values[1:-1]) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert sorted(s["attempt"] for s in _publish_steps(env, "apub-2") if s.get("attempt")) == [1, 1, 2, 2]


def test_publish_outside_an_attempt_is_refused_and_bad_values_fail_the_caller() -> None:
    with pytest.raises(DurableError, match="none runs here"):
        activity.publish("progress", 1)
    FAILS.pop("c", None)

    @durable_activity(name="apub.bad")
    def bad() -> None:
        activity.publish("t", {1, 2})

    @durable.workflow(name="apub.badflow")
    def badflow() -> None:
        bad()

    env = WorkflowEnvironment(durable)
    h = env.start(badflow, _workflow_id="apub-3")
    assert h.status() == "failed" and "JSON" in str(env.engine.read_exec("apub-3")["error"]["message"])


@durable_activity(name="apub.tell")
def tell(run: int) -> None:
    activity.publish("runs", run)


@durable.workflow(name="apub.rolling")
def rolling(run: int) -> int:
    tell(run)
    if run < 2:
        wf.continue_as_new(run + 1)
    wf.wait_signal("stop")
    return run


def test_values_published_in_each_run_reach_that_runs_stream() -> None:
    """Continue-as-new prunes the old runs' values and their marks (upkeep.prune_run); the new run's
    are still taken into its stream."""
    env = WorkflowEnvironment(durable)
    h = env.start(rolling, 0, _workflow_id="apub-4")
    live = []
    with pytest.raises(DurableTimeoutError):  # it waits for "stop": its stream is run 2's
        for value in h.stream("runs", timeout=0.05):
            live.append(value)
    assert live == [2]
    ids = {d["id"] for d in env.store.query_partition("apub-4").docs}
    assert {"apub:000003", "apubx:000003"} <= ids and not ids & {"apub:000001", "apubx:000002"}
    env.signal(h, "stop", True)
    assert h.result() == 2 and list(h.stream("runs")) == [2]
