"""The Celery app of the Celery benches: ``celery -A apps.benchapp worker`` (cwd: a temp dir).

Configured from the environment by :mod:`_common` so that the client process and its workers
share one Redis database, one unique queue and one SQLite store file.

The same task function ``step`` serves both sides: inside a workflow it is a durable call,
outside one (``step.s()`` in a Celery ``chain``) it is an ordinary Celery task.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery, signals

from celery_durable import Durable, durable_activity

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")

app = Celery("benchapp", broker=BROKER, backend=os.environ.get("BENCH_RESULT_URL", BROKER))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    # the recovery scan is not part of what we measure (no beat runs in the benches)
    durable_install_beat=False,
    # BENCH_STICKY_CACHE_SIZE=0: every drive replays from the top (to compare with the cache)
    durable_sticky_cache_size=int(os.environ.get("BENCH_STICKY_CACHE_SIZE", "256")),
)
if os.environ.get("BENCH_EAGER_ACTIVITIES"):
    # BENCH_EAGER_ACTIVITIES=N: this worker runs up to N next activities itself (0: off); unset,
    # the library's default (the benches judge the defaults)
    app.conf.durable_eager_activities = int(os.environ["BENCH_EAGER_ACTIVITIES"])
durable = Durable(app)

#: every message goes to this queue when set (else the default): overhead.py's second worker
#: (eager activities) consumes its own queue, set by BENCH_ROUTE_QUEUE in that worker and by
#: the client for the runs of that variant
ROUTE_TO: str | None = os.environ.get("BENCH_ROUTE_QUEUE") or None


def _route(name: str, args: object, kwargs: object, options: object, task: object = None, **kw: object) -> object:
    return {"queue": ROUTE_TO} if ROUTE_TO else None


app.conf.task_routes = (_route,)


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: object) -> None:
    ready = os.environ.get("BENCH_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))


@durable_activity(name="bench.step")
def step(x: int) -> int:
    """The trivial activity / task: one addition."""
    return x + 1


@durable.workflow(name="bench.sequential")
def sequential(n: int) -> int:
    """``n`` trivial activities one after the other (the overhead bench uses n = 10)."""
    x = 0
    for _ in range(n):
        x = step(x)
    return x


@durable.workflow(name="bench.three")
def three(x: int) -> int:
    """Three trivial activities in a row (the throughput bench)."""
    return step(step(step(x)))


@durable_activity(name="bench.local_step", local=True)
def local_step(x: int) -> int:
    """The same addition as a *local* activity: run by the drive itself, no broker round trip."""
    return x + 1


@durable.workflow(name="bench.three_local")
def three_local(x: int) -> int:
    """Three trivial local activities in a row (the throughput bench's ``local`` variant)."""
    return local_step(local_step(local_step(x)))
