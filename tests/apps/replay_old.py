"""The code a store's histories were recorded with, for the replay-check tests (see
:mod:`tests.apps.replay_app`, the next deploy's code)."""

from __future__ import annotations

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf

app = Celery("replay-old", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")


@durable_activity(name="rp.a")
def step_a(x: int) -> str:
    return f"a{x}"


@durable_activity(name="rp.b")
def step_b(x: int) -> str:
    return f"b{x}"


@durable_activity(name="rp.c")
def step_c(x: int) -> str:
    return f"c{x}"


@durable.workflow(name="rp.same")
def same(x: int) -> str:
    first = step_a(x)
    wf.wait_signal("go")
    return first + step_b(x)


@durable.workflow(name="rp.changed")
def changed(x: int) -> str:
    first = step_a(x)
    wf.wait_signal("go")
    return first + step_b(x)
