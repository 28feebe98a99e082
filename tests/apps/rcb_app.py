"""Apps for tests/breakers/test_replay_check_breaks.py: ``old`` is the code a store's histories
were recorded with, ``app``/``durable`` the next deploy's (``celery -A tests.apps.rcb_app durable
replay-check``)."""

from __future__ import annotations

import sys

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf

old_app = Celery("rcb-old", set_as_current=False)
old = Durable(old_app, store="memory://")
app = Celery("rcb-new", set_as_current=False)
durable = Durable(app, store="memory://")


class Interrupted(BaseException):
    """Not an Exception: what a workflow might raise (or a library under it)."""


@durable_activity(name="rcb.a")
def step_a(x: int) -> str:
    return f"a{x}"


@durable_activity(name="rcb.b")
def step_b(x: int) -> str:
    return f"b{x}"


def _recorded(x: int) -> str:
    first = step_a(x)
    wf.wait_signal("go")
    return first + step_b(x)


def _old(name: str):  # type: ignore[no-untyped-def]
    def recorded(x: int) -> str:
        return _recorded(x)

    return old.workflow(name=name)(recorded)


#: the old code's workflows, by name
OLD = {name: _old(name) for name in ("rcb.ok", "rcb.exit", "rcb.base")}


@durable.workflow(name="rcb.ok")
def ok(x: int) -> str:
    return _recorded(x)


@durable.workflow(name="rcb.exit")
def exits(x: int) -> str:
    first = step_a(x)
    sys.exit(0)  # a bug in the new code (or a library it calls)
    return first


@durable.workflow(name="rcb.base")
def base(x: int) -> str:
    step_a(x)
    raise Interrupted("new code raises a BaseException")
