"""Breakers: the outbox problems overview and ``durable.outbox.retry`` (glue/outbox.py,
engine/outbox/problems.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from celery import Celery

from celery_durable import Durable
from celery_durable.engine.admin.operator import OperationRefused
from celery_durable.glue.outbox import Outbox
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("breaker-outbox", set_as_current=False)
durable = Durable(app, store="memory://")
SENT: list[str] = []
BROKEN = [True]


@durable.effect("brk.charge", max_attempts=1)
def charge(card: str) -> None:
    if BROKEN[0]:
        raise ConnectionRefusedError("gateway down")
    SENT.append(card)


def _outbox(env: WorkflowEnvironment) -> Outbox:
    """``durable.outbox`` bound to the environment's engine (what the CLI and the UI call)."""
    box = Outbox.__new__(Outbox)
    box._durable = SimpleNamespace(engine=env.engine, registry=durable.registry, settings=durable.settings)  # type: ignore[assignment]
    box.effects = durable.outbox.effects
    box._lock = threading.Lock()
    return box


def _failed_charge(card: str, effect_id: str) -> tuple[WorkflowEnvironment, Outbox]:
    """An environment whose charge ``effect_id`` failed for good, the gateway mended since."""
    SENT.clear()
    BROKEN[0] = True
    env = WorkflowEnvironment(durable)
    box = _outbox(env)
    box.enqueue("brk.charge", card, key=f"pay-{effect_id}", effect_id=effect_id)
    env.run_until_idle()
    assert box.get(effect_id).status == "failed"  # type: ignore[union-attr]
    BROKEN[0] = False
    return env, box


def test_retrying_an_effect_that_was_already_retried_does_not_run_it_again() -> None:
    env, box = _failed_charge("card-1", "c-1")
    first = box.retry("c-1")  # an operator retries it (the /effects button, `durable outbox retry`)
    assert box.problems().failed == ()  # it left the overview
    second_id = None
    try:  # a second operator (or a double click, a CLI re-run) retries the same failed effect
        second_id = box.retry("c-1")
    except OperationRefused:
        pass
    env.run_until_idle()
    assert SENT.count("card-1") == 1, (
        f"the failed effect c-1 ran {SENT.count('card-1')} times after two retries ({first}, {second_id}): "
        "Outbox.retry checks only status == failed, which the retried row keeps, and never its "
        "retried_as; ProblemReads.retried marks it again instead of refusing"
    )


def test_racing_retries_of_one_failed_effect_enqueue_one_row() -> None:
    """The id of a retry is decided by the row retried: callers racing enqueue the same effect
    id, which the outbox admits once."""
    env, box = _failed_charge("card-2", "c-2")
    barrier, ids = threading.Barrier(4), []

    def retry() -> None:
        barrier.wait()
        ids.append(box.retry("c-2"))

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    env.run_until_idle()
    assert ids == ["c-2:retry1"] * 4 and SENT.count("card-2") == 1
    # a retry that fails too is retried as the next one in the chain
    BROKEN[0] = True
    box.enqueue("brk.charge", "card-3", key="pay-3", effect_id="c-3")
    env.run_until_idle()
    assert box.retry("c-3") == "c-3:retry1"
    env.run_until_idle()
    assert box.retry("c-3:retry1") == "c-3:retry2"
