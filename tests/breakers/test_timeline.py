"""Breakers: the execution page's timeline (celery_durable/ui/views.py ``_retries``)."""

from __future__ import annotations

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui.views import chart

app = Celery("breaker-timeline", set_as_current=False)
durable = Durable(app, store="memory://")
left = {"n": 0}


@durable_activity(name="brk.slowretry", local=True, autoretry_for=(RuntimeError,), max_retries=3,
                  default_retry_delay=60)  # fmt: skip
def slowretry(x: int) -> int:
    if left["n"] > 0:
        left["n"] -= 1
        raise RuntimeError("not yet")
    return x * 10


@durable.workflow(name="brk.local_retry")
def local_retry(x: int) -> int:
    return slowretry(x)


def test_a_local_activity_that_succeeded_after_a_timer_backoff_is_not_drawn_as_all_attempts_failed() -> None:
    left["n"] = 1  # attempt 1 fails; 60 s backoff (over the inline bound: a retry timer); attempt 2 succeeds
    env = WorkflowEnvironment(durable)
    h = env.start(local_retry, 4)
    env.run_until_idle()
    env.clock.advance(61)
    env.run_until_idle()
    assert env.result(h) == 40
    detail = Admin(env.engine).describe(h.id)
    (step,) = [s for s in detail.steps if s.kind == "activity"]
    assert step.state == "ok" and step.attempts == 2
    titles = [b.title for row in chart(detail, env.clock.now()).rows for b in row.bars]
    lies = [t for t in titles if "attempts 1-2 failed" in t]
    assert not lies, (
        "the timeline says every attempt of a local activity failed although its last one succeeded "
        f"(the retry's start is never recorded on its marker, so _retries counts it as failed): {titles}"
    )
