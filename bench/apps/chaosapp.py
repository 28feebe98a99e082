"""The app of the fault benches (chaos, recovery, timers): ``celery -A apps.chaosapp worker|beat``.

Short leases and scan intervals (from the environment) so recovery is quick to observe.
Activity executions are counted in Redis (``INCR``) so duplicates are visible across processes.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import redis
from celery import Celery, signals

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
COUNTERS = os.environ.get("BENCH_COUNTER_PREFIX", "chaos")

app = Celery("chaosapp", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    durable_lease_ttl=float(os.environ.get("BENCH_LEASE_TTL", "3")),
    durable_heartbeat_interval=float(os.environ.get("BENCH_HEARTBEAT", "1")),
    durable_recovery_interval=float(os.environ.get("BENCH_RECOVERY_INTERVAL", "1")),
    durable_drive_timeout=float(os.environ.get("BENCH_DRIVE_TIMEOUT", "3")),
    durable_activity_queue_timeout=float(os.environ.get("BENCH_QUEUE_TIMEOUT", "5")),
    durable_clock_interval=float(os.environ.get("BENCH_CLOCK_INTERVAL", "1")),
    durable_timer_fast_path_max=float(os.environ.get("BENCH_FAST_TIMER_MAX", "60")),
)
if os.environ.get("BENCH_EAGER_ACTIVITIES"):  # chaos.py --eager-activities N; unset: the library's default
    app.conf.durable_eager_activities = int(os.environ["BENCH_EAGER_ACTIVITIES"])
durable = Durable(app)
_redis = redis.Redis.from_url(BROKER)


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: object) -> None:
    ready = os.environ.get("BENCH_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))


def expected(key: str, i: int) -> str:
    """What ``work(key, i, …)`` returns: a pure function, so a fault-free run is computable."""
    return hashlib.sha256(f"{key}:{i}".encode()).hexdigest()[:12]


@durable_activity(name="chaos.work")
def work(key: str, i: int, ms: float) -> str:
    _redis.incr(f"{COUNTERS}:runs:{key}:{i}")
    _redis.set(f"{COUNTERS}:started:{key}:{i}", time.time())
    time.sleep(ms / 1000)
    return expected(key, i)


@durable.workflow(name="chaos.pipeline")
def pipeline(key: str, steps: int, ms: float) -> list[str]:
    return [work(key, i, ms) for i in range(steps)]


@durable.workflow(name="chaos.nap")
def nap(seconds: float) -> float:
    due = wf.now().timestamp() + seconds
    wf.sleep(seconds)
    return wf.now().timestamp() - due


@durable_activity(name="chaos.long_first")
def long_first(key: str, ms: float) -> int:
    """Runs ``ms`` the first time (long enough to be killed in), instantly when re-run."""
    runs = int(_redis.incr(f"{COUNTERS}:runs:{key}:0"))
    _redis.set(f"{COUNTERS}:started:{key}:0", time.time())
    if runs == 1:
        time.sleep(ms / 1000)
    return runs


@durable.workflow(name="chaos.one_long")
def one_long(key: str, ms: float) -> int:
    return long_first(key, ms)
