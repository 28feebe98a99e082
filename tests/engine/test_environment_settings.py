"""Found by the adversarial review: ``WorkflowEnvironment(durable)`` (``celery_durable/testing/env.py``)."""

from __future__ import annotations

from celery import Celery

from celery_durable import Durable
from celery_durable.testing.env import WorkflowEnvironment


def test_environment_runs_with_the_settings_of_the_durable_it_was_given() -> None:
    """The environment builds its engine with ``Settings()`` (defaults), not ``durable.settings``:
    a test of an app configured with, e.g., a 2-attempt lost-activity limit or a short admit grace
    exercises other settings than the app's workers use."""
    app = Celery("adv-env-settings", set_as_current=False)
    durable = Durable(app, store="memory://", max_lost_attempts=2, outbox_admit_grace=0.5, drive_timeout=7)
    env = WorkflowEnvironment(durable)
    s = env.engine.settings
    assert (s.max_lost_attempts, s.outbox_admit_grace, s.drive_timeout) == (2, 0.5, 7.0)
