"""More adversarial workflows for eager activities (``durable_eager_activities``): Celery signals
and ``current_task`` of kept activities, continue_as_new in an eager chain, effects enqueued from
a kept activity, other brokers. ``celery -A tests.apps.eager_adv2 worker``; configured from the
environment like tests.apps.eager_adv."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import signals

from celery_durable import ActivityError, Durable, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app, env_float, note_in, notes_in

app = env_app(
    "eager_adv2",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "10")),
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
    durable_sticky_cache_size=int(os.environ.get("TEST_STICKY", "256")),
    worker_max_tasks_per_child=int(os.environ["TEST_MAX_TASKS"]) if os.environ.get("TEST_MAX_TASKS") else None,
)
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def note(name: str, doc: dict[str, Any]) -> None:
    note_in(MARKS, name, doc)


def notes(name: str) -> list[dict[str, Any]]:
    return notes_in(MARKS, name)


# --- Celery signals: one line per signal, with the id the signal names and the task's request id


def _sig(kind: str, task_id: Any, sender: Any) -> None:
    req = getattr(sender, "request", None)
    note("signals", {"sig": kind, "id": task_id, "req": getattr(req, "id", None), "name": getattr(sender, "name", "")})


@signals.task_prerun.connect  # type: ignore[untyped-decorator]
def _prerun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    _sig("prerun", task_id, sender)


@signals.task_postrun.connect  # type: ignore[untyped-decorator]
def _postrun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    _sig("postrun", task_id, sender)


@signals.task_success.connect  # type: ignore[untyped-decorator]
def _success(sender: Any = None, **_: Any) -> None:
    _sig("success", getattr(getattr(sender, "request", None), "id", None), sender)


@signals.task_failure.connect  # type: ignore[untyped-decorator]
def _failure(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    _sig("failure", task_id, sender)


@signals.task_retry.connect  # type: ignore[untyped-decorator]
def _retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    _sig("retry", getattr(request, "id", None), sender)


def ran(key: str, what: str) -> None:
    note(f"ran-{key}", {"what": what, "pid": os.getpid(), "t": time.time()})


@durable_activity
def step(key: str, x: int) -> int:
    from celery import current_task

    req = current_task.request if current_task else None
    ran(key, f"step {x}")
    note(f"cur-{key}", {"x": x, "id": getattr(req, "id", None), "name": getattr(current_task, "name", None)})
    return x + 1


@durable_activity(bind=True, max_retries=1, default_retry_delay=0)
def again(self: Any, key: str) -> int:
    ran(key, f"again {self.request.retries}")
    if self.request.retries < 1:
        raise self.retry(countdown=0.2)
    return 7


@durable_activity
def boom(key: str) -> int:
    ran(key, "boom")
    raise ValueError("boom")


@durable.workflow(name="eager_adv2.signalled")
def signalled(key: str) -> list[Any]:
    a = step(key, 0)
    b = step(key, a)
    c = again(key)
    try:
        boom(key)
        d: Any = None
    except ActivityError as exc:
        d = exc.type_name
    return [a, b, c, d, step(key, b)]


@durable.workflow(name="eager_adv2.steps")
def steps(key: str, n: int) -> int:
    x = 0
    for _ in range(n):
        x = step(key, x)
    return x


@durable.workflow(name="eager_adv2.renewing")
def renewing(key: str, rounds: int, total: int = 0) -> int:
    """Two steps per run, then continue_as_new until ``rounds`` runs are done."""
    total = step(key, total)
    total = step(key, total)
    if rounds > 1:
        wf.continue_as_new(key, rounds - 1, total)
    return total


# --- effects: enqueued from inside an activity, and emitted by the workflow


@durable.effect("eager_adv2.noted")
def noted(payload: dict[str, Any]) -> None:
    note(f"fx-{payload['key']}", {"i": payload["i"], "pid": os.getpid()})


@durable_activity
def enqueue_fx(key: str, i: int) -> int:
    ran(key, f"enqueue_fx {i}")
    durable.outbox.enqueue("eager_adv2.noted", {"key": key, "i": i}, effect_id=f"{key}-fx-{i}")
    return i + 1


@durable.workflow(name="eager_adv2.effects")
def effects(key: str, n: int) -> int:
    x = 0
    for _ in range(n):
        x = enqueue_fx(key, x)
    wf.emit("eager_adv2.noted", {"key": key, "i": 100})
    return step(key, x)


# --- a task's own priority (its route: the task attribute is deprecated in Celery, and a shared
# task's would be seen by every app of the test process): a delivery's request carries it

app.conf.task_routes = {"tests.apps.eager_adv2.urgent": {"priority": 7}}


@durable_activity(bind=True, max_retries=1, default_retry_delay=0)
def urgent(self: Any, key: str) -> list[Any]:
    req = self.request
    prio = (req.delivery_info or {}).get("priority")
    ran(key, f"urgent {req.retries} {prio}")
    if req.retries < 1:
        raise self.retry(countdown=0.2)
    return [req.retries, prio]


@durable.workflow(name="eager_adv2.prioritised")
def prioritised(key: str) -> list[Any]:
    a = step(key, 0)
    return [a, urgent(key)]


@durable.workflow(name="eager_adv2.forgetful")
def forgetful(key: str) -> int:
    """Ends in the commit that schedules an activity it never awaits."""
    a = step(key, 0)
    step.start(key, 50)
    return a
