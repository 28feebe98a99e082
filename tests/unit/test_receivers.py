"""Celery signal receivers installed by ``Durable(app)``."""

from __future__ import annotations

import time
from types import SimpleNamespace

from celery import Celery
from celery import signals as celery_signals

from celery_durable import Durable, durable_activity

app = Celery("receivers", broker="memory://", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="rx.act")
def act() -> int:
    return 1


@durable.workflow(name="rx.flow")
def flow() -> int:
    return act()


def test_postrun_releases_a_lease_left_behind() -> None:
    h = flow.start()
    engine = durable.engine
    assert engine.drive(h.id) == "suspended"
    attempt, why = engine.activities.begin(h.id, 1)
    assert attempt is not None, why
    assert attempt in engine.leases.running()
    assert engine.store.read(h.id, "s:000001")["lease"]["holder"] == attempt.holder
    # the task body ended without recording an outcome (e.g. a BaseException bypassed it)
    celery_signals.task_postrun.send(
        sender=None, task=SimpleNamespace(request=SimpleNamespace(durable_attempt=attempt))
    )
    marker = engine.store.read(h.id, "s:000001")
    assert marker["lease"] is None and marker["due_at"] <= time.time()
    assert attempt not in engine.leases.running()


def test_receivers_connect_once_per_app() -> None:
    before = len(celery_signals.task_postrun.receivers)
    from celery_durable.glue.hook_receivers import install

    install(durable)  # a second install for the same app adds nothing (dispatch_uid)
    assert len(celery_signals.task_postrun.receivers) == before
