"""The code of "the next deploy" for the replay-check tests: ``celery -A tests.apps.replay_app
durable replay-check``. ``rp.same`` is unchanged from :mod:`tests.apps.replay_old`; ``rp.changed``
now calls ``rp.c`` where the old code called ``rp.a``."""

from __future__ import annotations

from celery import Celery

from celery_durable import Durable
from celery_durable import workflow as wf
from tests.apps.replay_old import step_a, step_b, step_c

app = Celery("replay-new", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")


@durable.workflow(name="rp.same")
def same(x: int) -> str:
    first = step_a(x)
    wf.wait_signal("go")
    return first + step_b(x)


@durable.workflow(name="rp.changed")
def changed(x: int) -> str:
    first = step_c(x)  # was step_a: executions past step 1 cannot take this
    wf.wait_signal("go")
    return first + step_b(x)
