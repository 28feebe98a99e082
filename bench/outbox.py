"""The effect outbox under load, beside plain Celery tasks running the same handler.

10,000 effects over 100 keys (``e{i}`` on key ``k{i % 100}``), 2 workers × prefork concurrency
4, Redis broker, one SQLite store file. The bench process is the client: it enqueues everything
(``durable.outbox.enqueue``), then waits for the handlers to finish. Each handler run appends a
line (mode, key, seq, start, end) to a per-process file; from those files and the rows we get

* effects/s — total effects / (last handler end − first enqueue);
* claim latency — claim time − the moment the row became claimable (its ``available_at``, or
  the settle of the previous row of its key): p50 / p99, from the rows;
* per-key order violations — adjacent runs of one key that overlap or run out of enqueue
  order (target 0).

The plain-Celery row sends the same handler as an ordinary task (``bench.plain``), same keys,
same workers, same run: no store, no ordering (its "latency" is send → start).

    python bench/outbox.py            # 10,000 effects, 100 keys
    python bench/outbox.py --quick    # 1,000 effects, 20 keys

This file is also the workers' Celery app (``celery -A outbox worker``, ``bench/`` on the path).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from celery import Celery, signals
from pydantic import BaseModel

from celery_durable import Durable

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")

app = Celery("bench_outbox", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=4,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    durable_install_beat=False,  # the liveness scan is not what we measure
)
durable = Durable(app)

_log_file: Any = None


@signals.worker_ready.connect
def _ready(**_: object) -> None:
    ready = os.environ.get("BENCH_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))


class Item(BaseModel):
    seq: int


def handle(mode: str, key: str, seq: int, sent: float = 0.0) -> None:
    """The handler both sides run: trivial work, one line of evidence."""
    global _log_file
    start = time.time()
    if _log_file is None or _log_file[0] != os.getpid():
        folder = Path(os.environ.get("BENCH_LOG_DIR", "."))
        _log_file = (os.getpid(), (folder / f"runs-{os.getpid()}.log").open("a", buffering=1))
    _log_file[1].write(f"{mode} {key} {seq} {start:.6f} {time.time():.6f} {sent:.6f}\n")


@durable.effect("bench.fx")
def fx(item: Item) -> None:
    from celery_durable.outbox import effect_context

    handle("outbox", effect_context().key, item.seq)


@app.task(name="bench.plain", ignore_result=True)
def plain(key: str, seq: int, sent: float) -> None:
    handle("plain", key, seq, sent)


# --- the client ------------------------------------------------------------------------------------


def _runs(folder: Path, mode: str) -> list[tuple[str, int, float, float, float]]:
    out = []
    for path in folder.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[0] == mode:
                out.append((parts[1], int(parts[2]), float(parts[3]), float(parts[4]), float(parts[5])))
    return out


def _wait_runs(folder: Path, mode: str, n: int, timeout: float) -> list[tuple[str, int, float, float, float]]:
    deadline = time.monotonic() + timeout
    while True:
        runs = _runs(folder, mode)
        if len({(k, s) for k, s, *_ in runs}) >= n:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mode}: {len(runs)} of {n} handler runs after {timeout}s")
        time.sleep(0.2)


def order_violations(runs: list[tuple[str, int, float, float, float]]) -> int:
    """Adjacent runs of one key (by start time) that overlap or go against enqueue order."""
    by_key: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for key, seq, start, end, _ in runs:
        by_key[key].append((start, end, seq))
    bad = 0
    for spans in by_key.values():
        spans.sort()
        for (_, end, seq), (start, _, seq2) in zip(spans, spans[1:], strict=False):
            if start < end or seq2 < seq:
                bad += 1
    return bad


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import bench_env, fmt_ms, machine, percentile, print_table, start_worker, verdict

    from celery_durable.engine.outbox import claim_latency

    n, keys = args.effects, args.keys
    print(f"{machine()} at the start", flush=True)
    with bench_env("outbox") as env:
        logs = env.tmp / "runs"
        logs.mkdir()
        env.env["BENCH_LOG_DIR"] = str(logs)
        env.apply_to_process()
        app.conf.update(broker_url=env.env["BENCH_BROKER_URL"], task_default_queue=env.queue)
        durable.configure(store=env.store_url)
        workers = [start_worker(env, app="outbox", concurrency=args.concurrency) for _ in range(args.workers)]
        try:
            outbox = durable.outbox
            # warm-up: pool children, connections, schema
            for i in range(20):
                outbox.enqueue("bench.fx", {"seq": i}, key=f"warm{i % 4}", effect_id=f"warm-{i}")
                plain.apply_async(args=[f"warm{i % 4}", i, time.time()])
            _wait_runs(logs, "outbox", 20, 120)
            _wait_runs(logs, "plain", 20, 120)
            for path in logs.glob("runs-*.log"):
                path.write_text("")

            # the outbox: enqueuer threads own disjoint keys, so each key's enqueue order is defined
            def enqueue_part(part: int) -> None:
                for i in range(n):
                    if (i % keys) % args.enqueuers == part:
                        outbox.enqueue("bench.fx", {"seq": i}, key=f"k{i % keys:03d}", effect_id=f"e{i:06d}")

            t0 = time.time()
            with ThreadPoolExecutor(args.enqueuers) as pool:
                list(pool.map(enqueue_part, range(args.enqueuers)))
            t_enqueued = time.time()
            fx_runs = _wait_runs(logs, "outbox", n, args.timeout)
            fx_end = max(r[3] for r in fx_runs)
            rows = [durable.outbox.core.get(f"e{i:06d}") for i in range(n)]
            latencies = [x for r in rows if r is not None and (x := claim_latency(r)) is not None]
            statuses = defaultdict(int)
            for r in rows:
                statuses[(r or {}).get("status", "missing")] += 1
            attempts = sum(int((r or {}).get("attempt") or 0) for r in rows)

            # plain Celery, same handler, same keys, same workers
            t1 = time.time()
            for i in range(n):
                plain.apply_async(args=[f"k{i % keys:03d}", i, time.time()])
            t_sent = time.time()
            plain_runs = _wait_runs(logs, "plain", n, args.timeout)
            plain_end = max(r[3] for r in plain_runs)
            plain_lat = [start - sent for _, _, start, _, sent in plain_runs]
        finally:
            for w in workers:
                w.stop()
            durable.shutdown()

    fx_rate = n / (fx_end - t0)
    plain_rate = n / (plain_end - t1)
    fx_span = fx_end - min(r[2] for r in fx_runs)
    plain_span = plain_end - min(r[2] for r in plain_runs)
    fx_viol, plain_viol = order_violations(fx_runs), order_violations(plain_runs)
    dup = len(fx_runs) - len({(k, s) for k, s, *_ in fx_runs})
    print(
        f"\n{n} effects over {keys} keys; {args.workers} workers x prefork -c {args.concurrency}; Redis broker, "
        f"SQLite store; handler = one log line; {args.enqueuers} enqueuer threads\n"
        "items/s: n / (last handler end - first submit); run span/s: n / (last end - first start)"
    )
    print_table(
        ["variant", "items/s", "submit/s", "run span/s", "latency p50 ms", "latency p99 ms", "order viol.", "dups"],
        [
            [
                "outbox (enqueue -> settled)",
                f"{fx_rate:.1f}",
                f"{n / (t_enqueued - t0):.1f}",
                f"{n / fx_span:.1f}",
                fmt_ms(percentile(latencies, 50)),
                fmt_ms(percentile(latencies, 99)),
                fx_viol,
                dup,
            ],
            [
                "plain Celery task (send -> run)",
                f"{plain_rate:.1f}",
                f"{n / (t_sent - t1):.1f}",
                f"{n / plain_span:.1f}",
                fmt_ms(percentile(plain_lat, 50)),
                fmt_ms(percentile(plain_lat, 99)),
                plain_viol,
                len(plain_runs) - len({(k, s) for k, s, *_ in plain_runs}),
            ],
        ],
        title="Throughput, claim latency (outbox: claimable -> claimed; plain: sent -> started), per-key order",
    )
    print(f"outbox rows: {dict(statuses)}; attempts {attempts} for {n} effects")
    print(f"{machine()} at the end")
    print(verdict("outbox per-key order violations", fx_viol, 0, higher_is_better=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 effects over 20 keys")
    parser.add_argument("--effects", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--enqueuers", type=int, default=4, help="client threads enqueueing (disjoint keys)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    if args.quick:
        args.effects, args.keys = 1_000, 20
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(args)


if __name__ == "__main__":
    main()
