"""An activity delivery proves which step marker it is for (issue 23, item 1).

From /work/shared/repro/trust/adv_reset_queued_message.py: a reset deletes the marker of a step
sent but not started; the re-run records a new step under the same number with other arguments;
the OLD message, delivered then, was accepted against the new marker: its function ran with the
old arguments and its value became the new step's result (the recorded call never ran). Here the
deliveries are eager ``task.apply`` with the step header a worker receives (what the message the
dispatcher sent holds: the marker's token ``t`` and the marker's recorded arguments).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.activities.delivery import Delivery, input_digest, refusal, step_token
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.schema import marker_id, result_id
from celery_durable.glue.durable_activity import DURABLE_HEADER
from celery_durable.stores.memory import MemoryStore

app = Celery("delivery-proof", broker="memory://", set_as_current=False)
store = MemoryStore()
durable = Durable(app, store=store)
ran: list[str] = []


@durable_activity(name="dp.fail_once")
def fail_once(flag: str) -> str:
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise NonRetryableError("the first attempt fails (the bug an operator then fixes)")
    return "ok"


@durable_activity(name="dp.echo")
def echo(v: str) -> str:
    ran.append(v)
    return v


@durable.workflow(name="dp.reset_flow")
def reset_flow(flag: str) -> dict[str, str]:
    t = str(wf.uuid4())  # step 1
    fb = echo.start(t)  # step 2: its message stays queued
    fail_once(flag)  # step 3: fails the first time
    return {"t": t, "echo": fb.result()}


@durable.workflow(name="dp.retry_flow")
def retry_flow(flag: str) -> str:
    return fail_once(flag)  # step 1: fails the first time, retried by the operator


def message(eid: str, seq: int) -> tuple[list[Any], dict[str, Any]]:
    """The message the dispatcher sends for step ``seq`` as it stands now (args, headers)."""
    marker = store.read(eid, marker_id(seq))
    assert marker is not None
    meta: dict[str, Any] = {"e": eid, "s": seq, "r": 0, "w": "?"}
    if marker.get("token") is not None:
        meta["t"] = marker["token"]
    return list(marker["input"]["args"]), {DURABLE_HEADER: meta}


def deliver(name: str, msg: tuple[list[Any], dict[str, Any]], state: str = "SUCCESS") -> None:
    """Deliver ``msg`` as a worker would; an attempt that fails for good is a Celery FAILURE."""
    res = app.tasks[name].apply(args=msg[0], headers=msg[1])
    assert res.state == state, res.traceback


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


def _stale(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "stale delivery" in r.getMessage()
    ]


def test_a_queued_message_of_the_old_run_does_not_complete_the_reset_runs_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flag = os.path.join(tempfile.mkdtemp(), "flag")
    h = reset_flow.start(flag)
    durable.engine.drive(h.id)  # steps 1-3 recorded; 2 and 3 sent
    old = message(h.id, 2)  # the echo message: queued behind a backlog
    deliver("dp.fail_once", message(h.id, 3), "FAILURE")
    assert h.status() == "failed"
    before = durable.counters.snapshot().get("activity_stale_delivery", 0)
    Admin(durable.engine).reset(h.id, 1, reason="fixed fail_once")
    durable.engine.drive(h.id)  # the re-run: a new uuid at step 1, so other arguments at step 2
    new = message(h.id, 2)
    assert new[0] != old[0]  # the call the history now records
    with caplog.at_level(logging.WARNING, logger="celery_durable.activity"):
        deliver("dp.echo", old)  # the old run's message arrives now
    assert ran == [] and store.read(h.id, result_id(2)) is None  # dropped, not run
    assert _stale(caplog) and durable.counters.snapshot()["activity_stale_delivery"] == before + 1
    deliver("dp.echo", new)
    deliver("dp.fail_once", message(h.id, 3))
    value = h.result(timeout=0)
    assert value["echo"] == value["t"] and ran == [value["t"]]


def test_retry_rotates_the_token_so_an_old_message_of_the_failed_attempt_is_stale() -> None:
    flag = os.path.join(tempfile.mkdtemp(), "flag")
    h = retry_flow.start(flag)
    durable.engine.drive(h.id)
    old = message(h.id, 1)
    deliver("dp.fail_once", old, "FAILURE")
    assert h.status() == "failed"
    durable.retry(h.id)
    deliver("dp.fail_once", old)  # a duplicate of the failed attempt's message
    assert h.status() == "running" and store.read(h.id, result_id(1)) is None
    new = message(h.id, 1)
    assert new[1] != old[1]  # same arguments, a new token
    deliver("dp.fail_once", new)
    assert h.result(timeout=0) == "ok"


def test_resume_keeps_the_token() -> None:
    h = reset_flow.start(os.path.join(tempfile.mkdtemp(), "flag"))
    durable.engine.drive(h.id)
    token = store.read(h.id, marker_id(2))["token"]  # type: ignore[index]
    h.cancel()
    durable.resume(h.id)
    assert store.read(h.id, marker_id(2))["token"] == token  # type: ignore[index]


# --- the rule itself ------------------------------------------------------------------------


def _marker(**extra: Any) -> dict[str, Any]:
    return {"name": "a", "input": {"args": [1, {"x": 2, "y": 3}], "kwargs": {"k": "v"}}} | extra


def test_refusal_checks_token_name_and_input() -> None:
    token = step_token("e", 0, 2, 0)
    marker = _marker(token=token)
    args, kwargs = [1, {"y": 3, "x": 2}], {"k": "v"}  # key order does not matter
    assert refusal(marker, Delivery.of(token, "a", args, kwargs)) is None
    assert refusal(marker, Delivery.of(step_token("e", 0, 2, 1), "a", args, kwargs))  # an older reset
    assert refusal(marker, Delivery.of(None, "a", args, kwargs))  # a token-less message
    assert refusal(marker, Delivery.of(token, "b", args, kwargs))  # another activity
    assert refusal(marker, Delivery.of(token, "a", [2, {"y": 3, "x": 2}], kwargs))  # other arguments
    assert refusal(marker, Delivery(token, "a", None)) is None  # in-process: arguments from the marker


def test_a_legacy_marker_accepts_only_a_token_less_message() -> None:
    legacy = _marker()  # written before tokens (rolling upgrade)
    digest = input_digest([1, {"x": 2, "y": 3}], {"k": "v"})
    assert refusal(legacy, Delivery(None, "a", digest)) is None
    assert refusal(legacy, Delivery(step_token("e", 0, 2, 0), "a", digest))


def test_tokens_differ_by_execution_run_step_and_reset() -> None:
    tokens = {step_token(e, r, s, g) for e in ("a", "b") for r in (0, 1) for s in (1, 2) for g in (0, 1)}
    assert len(tokens) == 16


def test_a_step_recorded_before_tokens_still_runs_its_token_less_message() -> None:
    """Rolling upgrade: a marker an older version wrote has no token; its message neither."""
    h = retry_flow.start(os.path.join(tempfile.mkdtemp(), "flag"))
    durable.engine.drive(h.id)
    marker = store.read(h.id, marker_id(1))
    assert marker is not None
    legacy = {k: v for k, v in marker.items() if k not in ("token", "_etag")}
    store.replace(legacy, if_match=marker["_etag"])
    durable.engine.cache.invalidate(h.id)
    tokened = (list(marker["input"]["args"]), {DURABLE_HEADER: {"e": h.id, "s": 1, "r": 0, "t": marker["token"]}})
    deliver("dp.fail_once", tokened)  # a newer message cannot claim a legacy marker
    assert store.read(h.id, result_id(1)) is None
    deliver("dp.fail_once", message(h.id, 1), "FAILURE")  # the legacy, token-less message runs (and fails once)
    assert h.status() == "failed"
