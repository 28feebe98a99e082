"""Adversarial workflows for eager activities (``durable_eager_activities``): request fields,
worker time limits, rate limits, ``.delay()`` from inside an activity.
``celery -A tests.apps.eager_adv worker``; configured from the environment like tests.apps.eager."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import shared_task

from celery_durable import Durable, durable_activity
from tests.apps._common import env_app, env_float, note_in, notes_in

app = env_app(
    "eager_adv",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "10")),
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
    durable_eager_start=os.environ.get("TEST_EAGER_START") == "1",
)
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def note(name: str, doc: dict[str, Any]) -> None:
    note_in(MARKS, name, doc)


def notes(name: str) -> list[dict[str, Any]]:
    return notes_in(MARKS, name)


@durable_activity
def slow(x: int, secs: float) -> int:
    time.sleep(secs)
    return x + 1


@durable.workflow(name="eager_adv.slow_steps")
def slow_steps(n: int, secs: float) -> int:
    x = 0
    for _ in range(n):
        x = slow(x, secs)
    return x


@durable_activity(rate_limit="12/m")  # at most one start every 5 s in a worker
def rated(key: str, x: int) -> int:
    note(f"rated-{key}", {"t": time.time(), "pid": os.getpid()})
    return x + 1


@durable.workflow(name="eager_adv.rated_steps")
def rated_steps(key: str, n: int) -> int:
    x = 0
    for _ in range(n):
        x = rated(key, x)
    return x


@shared_task(name="tests.apps.eager_adv.record")
def record(key: str) -> None:
    """A plain task sent with ``.delay()`` from inside an activity: what it was sent with."""
    from celery import current_task

    req = current_task.request
    note(f"record-{key}", {"id": req.id, "parent_id": req.parent_id, "root_id": req.root_id})


@durable_activity(bind=True)
def whoami(self: Any, key: str, i: int) -> dict[str, Any]:
    req = self.request
    record.delay(f"{key}-{i}")
    return {
        "i": i,
        "id": req.id,
        "parent_id": req.parent_id,
        "root_id": req.root_id,
        "retries": req.retries,
        "is_eager": bool(req.is_eager),
        "called_directly": bool(req.called_directly),
        "routing_key": (req.delivery_info or {}).get("routing_key"),
        "hostname": req.hostname,
        "reply_to": req.reply_to,
        "correlation_id": req.correlation_id,
        "headers": sorted((req.headers or {}).keys()),
        "durable_step": (getattr(req, "durable_step", None) or {}).get("s"),
        "ignore_result": req.ignore_result,
        "timelimit": req.timelimit,
        "eta": req.eta,
        "expires": req.expires,
    }


@durable.workflow(name="eager_adv.who")
def who(key: str, n: int) -> list[dict[str, Any]]:
    return [whoami(key, i) for i in range(n)]


# --- Celery semantics of a kept activity ------------------------------------------------------

from celery_durable import ActivityError, NonRetryableError  # noqa: E402
from celery_durable import workflow as wf  # noqa: E402


def ran(key: str, what: str) -> None:
    """One line per attempt that ran user code (execution key, what, pid)."""
    note(f"ran-{key}", {"what": what, "pid": os.getpid(), "t": time.time()})


@durable_activity
def add(key: str, a: int, b: int) -> int:
    ran(key, f"add {a} {b}")
    return a + b


@durable_activity(bind=True, max_retries=2, default_retry_delay=0)
def bound_retry(self: Any, key: str) -> dict[str, Any]:
    req = self.request
    ran(key, f"bound_retry {req.retries}")
    note(f"br-{key}", {"retries": req.retries, "id": req.id, "headers": sorted((req.headers or {}).keys())})
    if req.retries < 2:
        raise self.retry(countdown=0.3)
    return {"retries": req.retries, "id": req.id}


@durable_activity(autoretry_for=(ConnectionError,), max_retries=1, default_retry_delay=0)
def exhaust(key: str) -> int:
    ran(key, "exhaust")
    raise ConnectionError("down")


@durable_activity(autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
def refuse(key: str) -> int:
    ran(key, "refuse")
    raise NonRetryableError("declined")


@durable_activity
async def aio(key: str, x: int) -> int:
    import asyncio

    ran(key, "aio")
    await asyncio.sleep(0.01)
    return x * 3


@durable.workflow(name="eager_adv.semantics")
def semantics(key: str) -> dict[str, Any]:
    out: dict[str, Any] = {"a": add(key, 0, 1)}
    out["bound"] = bound_retry(key)
    for name, act in (("exhaust", exhaust), ("refuse", refuse)):
        try:
            act(key)
            out[name] = None
        except ActivityError as exc:
            out[name] = [exc.type_name, exc.attempts]
    out["aio"] = aio(key, out["a"])
    return out


@durable_activity(local=True)
def loc(key: str, x: int) -> int:
    ran(key, f"loc {x}")
    return x * 2


@durable.workflow(name="eager_adv.kid")
def kid(key: str, x: int) -> int:
    return add(key, add(key, x, 1), 1)


@durable.workflow(name="eager_adv.mixed")
def mixed(key: str) -> list[int]:
    a = add(key, 0, 1)  # 1
    b, c, d = wf.gather(add.s(key, a, 10), add.s(key, a, 20), add.s(key, a, 30))  # 11 21 31
    e = loc(key, b)  # 22
    wf.sleep(0.3)
    f = add(key, e, 1)  # 23
    g = kid.start_child(key, f).result()  # 25
    s = int(wf.wait_signal("go"))
    h = add(key, g, s)
    return [a, b, c, d, e, f, g, h]


@durable.workflow(name="eager_adv.adds")
def adds(key: str, n: int, secs: float = 0.0) -> int:
    x = 0
    for _ in range(n):
        x = add(key, x, 1)
        if secs:
            slow(0, secs)
    return x


# --- an activity that calls another activity's function directly (a Celery task called as a function)


@durable_activity
def base(key: str, x: int) -> int:
    ran(key, f"base {x}")
    return x + 1


@durable_activity
def reuse(key: str, x: int) -> int:
    ran(key, f"reuse {x}")
    got = base(key, x)  # a plain call of a task: Celery runs the function here
    return int(got) + 100


@durable.workflow(name="eager_adv.reuser")
def reuser(key: str) -> int:
    x = base(key, 0)  # 1
    y = base(key, x)  # 2
    return reuse(key, y)  # base(2) + 100 = 103


# --- an activity that starts a workflow and waits for it (durable_eager_start in the worker)


@durable_activity
def trigger(key: str) -> int:
    ran(key, "trigger")
    return int(adds.start(f"{key}-sub", 2).result(timeout=20)) + 100


@durable.workflow(name="eager_adv.triggers")
def triggers(key: str) -> int:
    return trigger(key)


# --- a router function that routes by the task (Celery passes ``task=`` to routers)

#: where ``gpu`` tasks go (a worker of the test consumes it too)
GPU_QUEUE = os.environ.get("TEST_GPU_QUEUE", "eager-gpu")


def route_by_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> Any:
    if task is not None and getattr(task, "gpu", False):
        return {"queue": GPU_QUEUE}
    return None


app.conf.task_routes = (route_by_task,)


@durable_activity(bind=True, gpu=True)
def on_gpu(self: Any, key: str, x: int) -> list[Any]:
    ran(key, f"on_gpu {x}")
    return [x + 1, (self.request.delivery_info or {}).get("routing_key")]


@durable.workflow(name="eager_adv.gpu_flow")
def gpu_flow(key: str) -> list[Any]:
    a = add(key, 0, 1)
    return on_gpu(key, a)


@durable_activity
def die_once(key: str, x: int) -> int:
    first = not notes(f"die-{key}")
    note(f"die-{key}", {"pid": os.getpid()})
    if first:
        os._exit(1)  # the pool process dies mid-attempt
    return x + 1


@durable.workflow(name="eager_adv.dies")
def dies(key: str) -> int:
    a = die_once(key, 0)
    return add(key, a, 1)


# --- a store outage while the outer delivery dispatches what its commit decided


def _outage_once(key: str) -> bool:
    """True the first time for ``key`` (across processes): the caller then fails."""
    flag = MARKS / f"outage-{key}"
    if not flag.exists():
        return False
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    return True


def _patch_links() -> None:
    from celery_durable.engine.children.links import Children
    from celery_durable.errors import StoreUnavailable

    original = Children.start_child
    if getattr(original, "_eager_adv", False):
        return

    def start_child(self: Any, req: Any) -> bool:
        if _outage_once("child"):
            raise StoreUnavailable("injected outage starting a child")
        return bool(original(self, req))

    start_child._eager_adv = True  # type: ignore[attr-defined]
    Children.start_child = start_child  # type: ignore[method-assign]


if os.environ.get("TEST_INJECT_OUTAGE") == "1":
    _patch_links()


@durable.workflow(name="eager_adv.both")
def both(key: str) -> list[int]:
    a = add(key, 0, 1)
    x, y = wf.gather(add.start(key, a, 1), kid.start_child(key, a))  # the activity first, then the child
    return [a, x, y, add(key, x, y)]
