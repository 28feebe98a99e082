"""Adversarial tests of activity forms (celery_durable/glue/durable_activity.py, testing/env.py).

Promise (README "Concepts" → Activity): an activity is "a Celery task marked @durable_activity
(on a plain function, or stacked on @app.task / @shared_task)"; "Celery's autoretry_for,
retry_backoff, max_retries, time_limit keep their meaning"; in WorkflowEnvironment
"Activities retry exactly as on a worker".
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-activities", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="adv.act.bound", bind=True)
def bound(self: Any, n: int) -> int:
    return n * 2


@durable.workflow(name="adv.act.uses_bound")
def uses_bound(n: int) -> int:
    return bound(n)


def test_a_bound_celery_task_is_a_usable_activity() -> None:
    """Breaks "an ordinary Celery task": with ``bind=True`` (Celery's usual option for tasks
    that call ``self.retry``) the argument codec binds the call's first argument to ``self``,
    so ``bound(21)`` fails the workflow with PayloadValidationError ("missing a required
    argument: 'n'")."""
    env = WorkflowEnvironment(durable)
    assert env.result(env.start(uses_bound, 21)) == 42
