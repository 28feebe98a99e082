"""A Celery app used by the worker tests: ``celery -A tests.apps.basic worker``.

Configured from the environment so each test can point it at its own broker and store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from celery_durable import (
    ActivityError,
    Durable,
    Limit,
    NonRetryableError,
    WorkflowTimedOutError,
    activity,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.errors import HeartbeatTimeoutError
from tests.apps._common import env_app, env_float, mark_in

app = env_app(
    "basic",
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_clock_interval=env_float("TEST_CLOCK_INTERVAL", "1"),
    durable_timer_fast_path_max=env_float("TEST_FAST_TIMER_MAX", "60"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
    durable_drive_timeout=env_float("TEST_DRIVE_TIMEOUT", "30"),
    durable_sticky_cache_size=int(os.environ.get("TEST_STICKY_CACHE_SIZE", "256")),
)
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def mark(name: str) -> int:
    """Append a line to a marks file (across processes); return how many lines it now has."""
    return mark_in(MARKS, name)


class Item(BaseModel):
    sku: str
    qty: int


@durable_activity
def add(a: int, b: int) -> int:
    return a + b


@durable_activity
def pack(item: Item) -> str:
    mark(f"pack-{item.sku}")
    return f"box:{item.sku}x{item.qty}"


@durable_activity(autoretry_for=(ConnectionError,), max_retries=5, default_retry_delay=0)
def flaky(key: str, failures: int) -> str:
    n = mark(f"flaky-{key}")
    if n <= failures:
        raise ConnectionError(f"attempt {n} failed")
    return f"ok after {n}"


@durable_activity(autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0)
def always_down(key: str) -> str:
    mark(f"down-{key}")
    raise ConnectionError("service down")


@durable_activity(autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
def refuses(key: str) -> str:
    mark(f"refuses-{key}")
    raise NonRetryableError("card declined")


@app.task(name="tests.apps.basic.plain_then_durable")
def _plain(x: int) -> int:
    return x * 2


stacked = durable_activity(_plain)


@durable.workflow(name="sum_chain")
def sum_chain(n: int) -> int:
    total = 0
    for i in range(n):
        total = add(total, i)
    return total


@durable.workflow(name="fan_out")
def fan_out(items: list[Item]) -> list[str]:
    return wf.gather(pack.s(item) for item in items)


@durable.workflow(name="retry_then_ok")
def retry_then_ok(key: str, failures: int) -> str:
    return flaky(key, failures)


@durable.workflow(name="compensate")
def compensate(key: str) -> dict[str, object]:
    try:
        always_down(key)
    except ActivityError as exc:
        return {"caught": exc.type_name, "attempts": exc.attempts, "undo": add(1, 1)}
    return {"caught": None}


@durable.workflow(name="non_retryable")
def non_retryable(key: str) -> dict[str, object]:
    try:
        refuses(key)
    except ActivityError as exc:
        return {"caught": exc.type_name, "attempts": exc.attempts}
    return {"caught": None}


@durable.workflow(name="stacked_flow")
def stacked_flow(x: int) -> int:
    return stacked(x) + 1


@durable.workflow(name="racing")
def racing(n: int) -> int:
    return sum(wf.gather(add.s(i, 0) for i in range(n)))


@durable_activity
def gate(path: str, timeout: float = 60.0) -> bool:
    """Block until ``path`` exists (the test opens the gate)."""
    import time

    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.02)
    return True


@durable_activity
def left() -> str:
    return "left"


@durable_activity
def right() -> str:
    return "right"


@durable.workflow(name="shifty")
def shifty(flag: str, gate_path: str) -> str:
    # Deliberately non-deterministic: the branch depends on the file system, not on history.
    first = left() if Path(flag).exists() else right()
    gate(gate_path)
    return first


class Approval(BaseModel):
    ok: bool
    by: str


@durable_activity
def note(key: str) -> int:
    """Count executions of this step across processes (workflow code itself is replayed)."""
    return mark(key)


@durable.workflow(name="sleeper")
def sleeper(key: str, seconds: float) -> float:
    """Sleep, then run one activity; return how late the timer fired (seconds)."""
    due = wf.now().timestamp() + seconds
    wf.sleep(seconds)
    woke = wf.now().timestamp()
    note(f"woke-{key}")
    return woke - due


@durable.workflow(name="deadlined")
def deadlined(key: str) -> str:
    """Sleep an hour; at its deadline (``options(timeout=)``) compensate with one activity."""
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        note(f"compensated-{key}")
        raise
    return "slept"


@durable.workflow(name="approval", signals={"approval": Approval})
def approval(timeout: float) -> str:
    try:
        got = wf.wait_signal("approval", timeout=timeout)
    except Exception as exc:  # DurableTimeoutError
        return type(exc).__name__
    return f"{got.by}:{got.ok}"


@durable.workflow(name="ticker")
def ticker(label: str) -> int:
    return note(f"tick-{label}")


if os.environ.get("TEST_SCHEDULE_EVERY"):
    from datetime import timedelta

    durable.schedule("every", ticker, timedelta(seconds=float(os.environ["TEST_SCHEDULE_EVERY"])), "sched")


@durable_activity
def slow(key: str, seconds: float) -> int:
    """Mark the start, work for a while, mark the end; return the pid that did it."""
    import time

    mark(f"start-{key}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    mark(f"end-{key}")
    return os.getpid()


@durable.workflow(name="slow_flow")
def slow_flow(key: str, seconds: float) -> int:
    return slow(key, seconds)


@durable.workflow(name="stalls_in_replay")
def stalls_in_replay(gate_path: str) -> int:
    first = add(1, 1)
    if not Path(gate_path).exists():
        # workflow code that hangs while driving, so a test can kill the worker mid-drive
        mark("drive-stalled")  # a plain side effect, not a durable step
        import time

        time.sleep(600)
    return first + add(2, 2)


@durable_activity
def needs_flag(flag: str) -> str:
    if not Path(flag).exists():
        raise NonRetryableError(f"{flag} is missing")
    return "flag found"


@durable.workflow(name="fragile")
def fragile(flag: str) -> str:
    return needs_flag(flag)


@durable_activity
def blob(key: str, n: int) -> str:
    mark(f"blob-{key}")
    return "x" * n


@durable.workflow(name="big_payloads")
def big_payloads(key: str, data: str, n: int) -> dict[str, int]:
    """Issue 12: a big input, a big activity result and a big workflow result (offloaded)."""
    out = blob(key, n)
    return {"input": len(data), "activity": len(out), "echo": len(data + out)}


@durable.workflow(name="tagged", signals={"go": str})
def tagged(key: str) -> str:
    """Issue 13 item 5: search attributes updated from the workflow on a real worker."""
    wf.upsert_search(stage="waiting")
    how = wf.wait_signal("go")
    wf.upsert_search(stage=how, tags=["done", key])
    return how


@durable_activity(autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=3600)
def backs_off(key: str) -> str:
    """Fails with a backoff of an hour: its execution waits in the retry's backoff."""
    raise ConnectionError(f"{key}: the service is down")


@durable.workflow(name="backing_off")
def backing_off(key: str) -> str:
    return backs_off(key)


@durable.workflow(name="family_tree")
def family_tree(depth: int, seconds: float) -> int:
    """A chain of children ``depth`` deep (ids ``<parent>-c``); the last one sleeps ``seconds``."""
    if depth == 0:
        wf.sleep(seconds)
        return 0
    child = family_tree.start_child(depth - 1, seconds, _workflow_id=f"{wf.execution_id()}-c")
    return child.result() + 1


@durable.effect("basic.bounce", max_attempts=1)
def bounce(to: str) -> None:
    """A mail server that refuses every message: the effect fails for good on its first attempt."""
    raise ConnectionRefusedError(f"550 mailbox {to} unavailable")


@durable.workflow(name="bounces")
def bounces(to: str) -> str:
    wf.emit("basic.bounce", to, key=f"mail-{to}")
    return "sent"


# --- heartbeats and cancelling a running activity (issue 26 §2, §3) ------------------------------


@durable_activity(name="basic.never_complete", heartbeat_timeout=10)
def never_complete(key: str) -> str:
    """Temporal's hello_cancellation activity: heartbeats until it is cancelled."""
    mark(f"hb-start-{key}")
    try:
        while True:
            activity.heartbeat()
            time.sleep(0.05)
    except activity.ActivityCancelled:
        mark(f"hb-cancelled-{key}")
        raise


@durable_activity(name="basic.cleanup_activity")
def cleanup_activity(key: str) -> str:
    mark(f"hb-cleanup-{key}")
    return "cleaned"


@durable.workflow(name="hello_cancellation")
def hello_cancellation(key: str) -> str:
    try:
        return never_complete(key)
    finally:
        cleanup_activity(key)


@durable_activity(name="basic.resumable_import", heartbeat_timeout=30)
def resumable_import(key: str, rows: int) -> int:
    """Imports ``rows`` rows, one per 50 ms, from where an earlier attempt's heartbeat got to;
    returns the row it started from."""
    start = int(activity.last_heartbeat_details(0))
    mark(f"imp-{key}-{start}")
    for n in range(start, rows):
        time.sleep(0.05)
        activity.heartbeat(n + 1)
    return start


@durable.workflow(name="importer")
def importer(key: str, rows: int) -> int:
    return resumable_import(key, rows)


@durable_activity(
    name="basic.stalls_once",
    heartbeat_timeout=1,
    autoretry_for=(HeartbeatTimeoutError,),
    max_retries=2,
    default_retry_delay=0,
)
def stalls_once(key: str) -> str:
    n = mark(f"stall-{key}")
    if n == 1:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # stuck in Python, no heartbeat: interrupted at its timeout
            pass
    activity.heartbeat()
    return f"attempt {n}"


@durable.workflow(name="stalling")
def stalling(key: str) -> str:
    return stalls_once(key)


# --- keyed limits (issue 26 §1): at most 2 at once per key, across every worker process ---------


@durable_activity(limit=Limit("it-stripe", max_running=2, key=lambda key, i, seconds: key))
def limited(key: str, i: int, seconds: float) -> int:
    """Note its start and end (time, pid) in the key's marks file; work ``seconds``."""
    mark(f"lim-{key}")  # one line per start: how many ran
    with open(MARKS / f"span-{key}", "a") as f:
        f.write(f"start {time.time()!r} {os.getpid()}\n")
    time.sleep(seconds)
    with open(MARKS / f"span-{key}", "a") as f:
        f.write(f"end {time.time()!r} {os.getpid()}\n")
    return i


@durable.workflow(name="limited_fan")
def limited_fan(key: str, n: int, seconds: float) -> list[int]:
    return wf.gather(limited.s(key, i, seconds) for i in range(n))


@durable_activity
def tenant_mark(key: str, what: str, tag: str) -> None:
    """Note ``what`` (start/end) of the execution ``tag`` with the time, in the key's marks file."""
    MARKS.mkdir(parents=True, exist_ok=True)
    with open(MARKS / f"wspan-{key}", "a") as f:
        f.write(f"{what} {time.time()!r} {tag}\n")


@durable_activity
def nap(seconds: float) -> None:
    time.sleep(seconds)


@durable.workflow(name="limited_tenant", limit=Limit("it-tenant", max_running=2, key=lambda key, tag, seconds: key))
def limited_tenant(key: str, tag: str, seconds: float) -> str:
    """Runs only while it holds one of its key's 2 slots: its first and last steps bound that."""
    tenant_mark(key, "start", tag)
    nap(seconds)
    tenant_mark(key, "end", tag)
    return tag


@durable_activity(pause_on_failure=True)
def flaky_service(key: str) -> str:
    """Fails for good until the file ``fixed-<key>`` exists in the marks directory."""
    if not (MARKS / f"fixed-{key}").exists():
        raise ConnectionRefusedError(f"service for {key} is down")
    return f"served {key}"


@durable.workflow(name="pauses_on_failure")
def pauses_on_failure(key: str) -> str:
    return flaky_service(key) + "!"


@durable_activity(name="basic.cv_add", autoretry_for=(ConnectionError,), default_retry_delay=0.2, max_retries=3)
def cv_add(x: int, y: int) -> int:
    """A canvas task that fails once per (x, y) with a ConnectionError (Celery retries it)."""
    if mark(f"cv-{x}-{y}") == 1:
        raise ConnectionError("first try fails")
    return x + y


@durable_activity(name="basic.cv_sum")
def cv_sum(numbers: list[int]) -> int:
    return sum(numbers)


@durable.workflow(name="publishes")
def publishes(n: int) -> int:
    """Streams ``n`` squares (an activity each) and an event, waiting for ``go`` half way."""
    wf.set_event("stage", "started")
    total = 0
    for i in range(n):
        total += cv_sum([i, i])
        wf.publish("progress", i)
        if i == n // 2:
            wf.wait_signal("go")
    wf.set_event("stage", "finished")
    return total


@durable_activity(name="basic.upd_fill")
def upd_fill(n: int) -> int:
    """Publishes ``n`` values on its execution's stream (``activity.publish``)."""
    for i in range(n):
        activity.publish("fill", i)
    return n


@durable.workflow(name="basic.updatable")
def updatable(start: int) -> int:
    """A counter updated from outside (``bump``, positive amounts only) until ``stop``."""
    total = [start]

    def positive(by: int) -> None:
        if by <= 0:
            raise ValueError(f"bump by a positive amount, not {by}")

    @wf.update("bump", validator=positive)
    def bump(by: int) -> int:
        total[0] += by
        return total[0]

    filled = upd_fill(3)  # updates apply while it waits here: read total after the call returns
    total[0] += filled
    wf.wait_signal("stop")
    return total[0]
