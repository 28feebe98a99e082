"""Attacks on streams and events (``wf.publish``/``wf.set_event``, ``handle.stream``/``get_event``;
celery_durable/engine/replay/events.py). Tests failed on the code they were written against
(f679124) unless their docstring says the attack held."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.errors import DurableTimeoutError
from celery_durable.testing.env import WorkflowEnvironment

pytestmark = pytest.mark.adversarial

durable = Durable(Celery("events-breaks", set_as_current=False), store="memory://")


@durable_activity(name="evb.echo")
def echo(x: Any) -> Any:
    return x


@durable.workflow(name="evb.can")
def can_pub(n: int) -> int:
    wf.publish("t", f"a{n}")
    wf.wait_signal("go")
    wf.publish("t", f"b{n}")
    if n < 1:
        wf.continue_as_new(n + 1)
    return n


def _follow_across_continue_as_new() -> list[Any]:
    env = WorkflowEnvironment(durable)
    h = env.start(can_pub, 0, _workflow_id="evb-can")
    reader = h.stream("t", timeout=5)
    seen = [next(reader)]  # "a0", read live while run 0 waits
    env.signal(h, "go", 1)  # run 0 publishes b0 and continues as new; run 1 publishes a1, waits
    env.signal(h, "go", 2)  # run 1 publishes b1 and completes
    assert h.status() == "completed"
    seen += list(reader)
    return seen


def test_reader_following_across_continue_as_new_skips_the_new_runs_first_values() -> None:
    """A reader following live keeps every value of the run it ends up in: after the execution
    continued as new, its stream starts at 0 again, so the reader must see ``a1`` (it read one
    value of run 0; that offset must not be applied to run 1)."""
    seen = _follow_across_continue_as_new()
    assert "a1" in seen and "b1" in seen, seen


def test_a_value_published_by_the_drive_that_continues_as_new_stays_with_the_run_that_ends() -> None:
    """Found: ``wf.publish("t", "b0")`` right before ``continue_as_new`` is committed with run 0 in
    the batch that moves the exec to run 1, and readers take the current run's values only, so no
    reader sees it. Not changed (its step belongs to the run that ends; carrying it into the new
    run would shift that run's step numbers): stated in the guide and in limitations.md, and
    pinned here — the reader goes on with the new run's stream from its start."""
    seen = _follow_across_continue_as_new()
    assert "b0" not in seen and seen[-2:] == ["a1", "b1"], seen


@durable.workflow(name="evb.live")
def live() -> None:
    for i in range(3):
        wf.publish("t", i)
    wf.wait_signal("go")
    wf.publish("t", 3)


def test_negative_offset_yields_values_twice() -> None:
    """An offset is a position: a negative one must be refused (PayloadValidationError/ValueError)
    or read as from the end once — never yield a value twice. ``follow`` slices ``found[-1:]``,
    then counts ``offset`` up from -1 to 0 and re-reads the whole stream from position 0."""
    env = WorkflowEnvironment(durable)
    h = env.start(live, _workflow_id="evb-neg")
    seen: list[Any] = []
    try:
        for v in h.stream("t", offset=-1, timeout=0.2):
            seen.append(v)
            if len(seen) > 10:
                break
    except (ValueError, DurableTimeoutError):
        pass
    assert len(seen) == len(set(seen)), seen  # [2, 0, 1, 2]: 2 twice


@durable.workflow(name="evb.named")
def named(codepoints: list[int]) -> str:
    wf.publish("".join(map(chr, codepoints)), 1)
    return "ok"


def test_topic_no_store_can_keep_crashes_the_drive() -> None:
    """A topic passes ``_check`` (1-256 characters) but holds a high surrogate followed by a low
    one, which no store keeps: like a non-JSON value it must be refused in the workflow (the
    execution fails with PayloadValidationError), not raise ConfigurationError out of the drive's
    commit (on a worker: the drive crashes on every delivery and the execution is stuck)."""
    env = WorkflowEnvironment(durable)
    h = env.start(named, [0xD83D, 0xDE00], _workflow_id="evb-surrogates")
    assert h.status() == "failed"
    assert "topic" in str(env.engine.read_exec(h.id)["error"]["message"])


@durable.workflow(name="evb.many")
def many(size: int, count: int) -> int:
    for _ in range(count):
        wf.publish("chunks", "x" * size)
    return count


def test_a_drive_publishing_more_than_a_store_batch_holds_fails_clearly() -> None:
    """Found: 60 values of 50 kB published in one loop make the drive's commit one batch of 3 MB,
    over the store's 2 MB batch limit (documents under 64 kB are not offloaded): the execution
    fails with DocumentTooLarge. An engine limit of any drive (a gather of 60 activities with
    50 kB arguments fails alike), not of streams: stated in limitations.md and pinned here — the
    failure is the execution's, named, never a lost or changed value."""
    env = WorkflowEnvironment(durable)
    h = env.start(many, 50_000, 60, _workflow_id="evb-many")
    assert h.status() == "failed"
    assert env.engine.read_exec(h.id)["error"]["type"] == "DocumentTooLarge"
