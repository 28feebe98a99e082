"""``celery -A apps.limitsapp worker`` for ``bench/limits.py``: the bench app, plus two activities
doing the same small fixed work (a sleep), one under a keyed ``Limit`` and one without.

Every process (the client and each pool child) counts its store round trips (the store is
wrapped in :class:`~celery_durable.testing.counting.CountingStore`). What the bench reads is kept
in memory and written by a daemon thread every 0.2 s to ``$BENCH_LIMITS_DIR`` (nothing on the hot
path but a list append): ``<pid>.counts.json`` (round trips by method, cumulative),
``<pid>.spans.jsonl`` (one line per activity body: variant, key, start, end, pid, execution,
step, attempt, from ``time.time()`` in the body itself) and ``<pid>.waited.jsonl`` (the steps the
engine queued on their limit: its ``limit_waiting`` event).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import signals

from apps.benchapp import app, durable
from celery_durable import Limit, activity, durable_activity
from celery_durable import workflow as wf
from celery_durable.stores import store_from_url
from celery_durable.testing.counting import CountingStore

__all__ = ["COUNTING", "app", "durable", "fan_free", "fan_limited", "key_of"]

MAX_RUNNING = int(os.environ.get("BENCH_LIMIT_MAX", "2"))
OUT = os.environ.get("BENCH_LIMITS_DIR")

#: this process's store, counting (the client's too: the bench polls through ``COUNTING.inner``)
COUNTING = CountingStore(store_from_url(os.environ["DURABLE_STORE_URL"], **durable.settings.store_options))
durable.configure(store=COUNTING)

_lock = threading.Lock()
_spans: list[list[Any]] = []
_waited: list[list[Any]] = []
_limit_events: dict[str, int] = {}


def key_of(workflow: int, j: int, per_workflow: int, keys: int) -> str:
    """The key of activity ``j`` of workflow ``workflow``: each workflow covers every key in runs
    of 2-3 consecutive activities (50 over 20), starting at a key of its own."""
    return f"k{(workflow + j * keys // per_workflow) % keys:02d}"


def _body(variant: str, key: str, i: int, ms: float) -> int:
    t0 = time.time()
    time.sleep(ms / 1000)
    t1 = time.time()
    info = activity.info()
    with _lock:
        _spans.append([variant, key, t0, t1, os.getpid(), info.execution_id, info.step, info.attempt])
    return i


@durable_activity(
    name="limits.limited", limit=Limit("bench-limit", max_running=MAX_RUNNING, key=lambda key, i, ms: key)
)
def limited(key: str, i: int, ms: float) -> int:
    return _body("limited", key, i, ms)


@durable_activity(name="limits.free")
def free(key: str, i: int, ms: float) -> int:
    return _body("free", key, i, ms)


@durable.workflow(name="limits.fan_limited")
def fan_limited(workflow: int, n: int, keys: int, ms: float) -> int:
    return sum(wf.gather(limited.s(key_of(workflow, j, n, keys), j, ms) for j in range(n)))


@durable.workflow(name="limits.fan_free")
def fan_free(workflow: int, n: int, keys: int, ms: float) -> int:
    return sum(wf.gather(free.s(key_of(workflow, j, n, keys), j, ms) for j in range(n)))


def _on_event(event: str, **kw: Any) -> None:
    if not event.startswith("limit_"):
        return
    with _lock:
        _limit_events[event] = _limit_events.get(event, 0) + 1
        if event == "limit_waiting":
            _waited.append([kw.get("execution_id"), kw.get("seq"), time.time()])


def _flush() -> None:
    if not OUT:
        return
    pid = os.getpid()
    with _lock:
        spans, waited = _spans[:], _waited[:]
        _spans.clear()
        _waited.clear()
        events = dict(_limit_events)
    counts = dict(COUNTING.counts)
    folder = Path(OUT)
    for name, rows in (("spans", spans), ("waited", waited)):
        if rows:
            with (folder / f"{pid}.{name}.jsonl").open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    tmp = folder / f"{pid}.counts.tmp"
    tmp.write_text(json.dumps({"counts": counts, "events": events}))
    tmp.replace(folder / f"{pid}.counts.json")


def _flusher() -> None:
    while True:
        time.sleep(0.2)
        try:
            _flush()
        except Exception:  # noqa: BLE001 - a bench helper: never take the worker down
            pass


_started = False


def _start() -> None:
    """Subscribe to the engine's events and start the flush thread, once per process."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    durable.engine.subscribe(_on_event)
    threading.Thread(target=_flusher, name="bench-limits-flush", daemon=True).start()


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]
def _child_init(**_: object) -> None:
    _start()  # a prefork pool process


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _main_ready(**_: object) -> None:
    _start()  # the main process: the one running the tasks with -P threads or solo
