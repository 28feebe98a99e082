"""Events and streams (issue 27 §4, first part, engine/replay/events.py): ``wf.publish(topic, v)``
read outside with ``handle.stream(topic, offset)`` — in order, live, from an offset, ending with
the execution — and ``wf.set_event(key, v)`` with ``handle.get_event(key, timeout)``: the latest
set; each recorded once (a replay adds nothing); bad names and non-JSON values refused in the
workflow."""

from __future__ import annotations

import threading
import time

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.errors import DurableTimeoutError, PayloadValidationError
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("events-tests", set_as_current=False), store="memory://")


@durable_activity(name="ev.work")
def work(n: int) -> int:
    return n * n


@durable.workflow(name="ev.progress")
def progress(n: int) -> int:
    wf.set_event("stage", "started")
    total = 0
    for i in range(n):
        total += work(i)
        wf.publish("progress", {"done": i + 1, "of": n})
        if i == 1:
            wf.wait_signal("go")  # a pause in the middle: a reader follows it live
    wf.set_event("stage", "finished")
    return total


@durable.workflow(name="ev.bad")
def bad(which: str) -> None:
    if which == "name":
        wf.publish("", 1)
    wf.set_event("k", {1, 2})


def test_a_stream_is_read_in_order_live_and_from_an_offset() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(progress, 4, _workflow_id="ev-1")
    assert h.get_event("stage") == "started"
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.extend(h.stream("progress", timeout=30)))
    reader.start()
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:  # the first two, live, while it waits
        time.sleep(0.01)
    assert seen == [{"done": 1, "of": 4}, {"done": 2, "of": 4}] and reader.is_alive()
    h.signal("go", True)
    env.run_until_idle()
    reader.join(timeout=10)
    assert not reader.is_alive() and [v["done"] for v in seen] == [1, 2, 3, 4]  # type: ignore[index]
    assert list(h.stream("progress", offset=3)) == [{"done": 4, "of": 4}]
    assert h.get_event("stage") == "finished" and h.result() == 0 + 1 + 4 + 9
    published = [d for d in env.engine.store.query_partition("ev-1").docs if d.get("kind") == "publish"]
    assert len(published) == 4  # each once, whatever the replays


def test_an_unset_event_times_out_and_bad_values_fail_the_workflow() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(progress, 3, _workflow_id="ev-2")
    with pytest.raises(DurableTimeoutError, match="nope"):
        h.get_event("nope", timeout=0.05)
    with pytest.raises(DurableTimeoutError):
        list(h.stream("progress", offset=2, timeout=0.05))  # waiting for the signal: nothing new
    for which, match in (("name", "topic"), ("value", "JSON")):
        b = env.start(bad, which, _workflow_id=f"ev-bad-{which}")
        assert b.status() == "failed"
        assert match in str(env.engine.read_exec(b.id)["error"]["message"])
    with pytest.raises(PayloadValidationError):
        list(h.stream(""))
