"""Result latency: how long after the worker committed an execution's end ``handle.result()``
returns, woken by a push (issues 14, 15) vs polling the store, side by side in one run.

One real ``celery worker`` (prefork ``-c 2``) on the bench's Redis database; the client starts
``sequential(--steps)`` and calls ``handle.result()``. Latency = the client's clock when
``result()`` returned minus the exec's ``completed_at`` (the worker's clock, same host). The runs
interleave the client's notifier on one engine:

* ``push (redis)``: Redis pub/sub on the Celery broker/result backend (store SQLite), published by
  the worker after the commit;
* ``push (postgres)``: the PostgreSQL store's NOTIFY in the commit's transaction, LISTEN in the
  client (a second phase with a PostgreSQL store; skipped with ``--no-postgres``);
* ``polling``: ``durable_result_push = "off"``: a read every 5% of the time waited, 1 ms to
  ``durable_result_poll_max`` (50 ms);
* ``tight 1 ms poll (floor)``: a read every millisecond: what is left is the commit itself
  (``completed_at`` is taken before the worker's commit) and the scheduling of two processes.

``Engine.wait`` is what ``handle.result()`` runs (the value is checked, not decoded).

    python bench/result_latency.py            # 60 runs per variant
    python bench/result_latency.py --quick    # 15 runs per variant
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

from _common import bench_env, exit_on_sigterm, fmt_ms, machine, percentile, print_table, start_worker

FLOOR = "tight 1 ms poll (floor)"
PG_BASE = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _phase(env: Any, store_url: str, runs: int, steps: int, concurrency: int) -> dict[str, list[float]]:
    """Interleaved runs with the client's push on and off; latencies (s) by variant."""
    env.env["DURABLE_STORE_URL"] = store_url
    env.apply_to_process()  # before the app is imported: it reads its queue from the environment
    from apps import benchapp

    from celery_durable.stores.push.base import NoPush

    worker = start_worker(env, concurrency=concurrency, loglevel=os.environ.get("BENCH_LOGLEVEL", "WARNING"))
    try:
        benchapp.durable.configure(store=store_url)
        engine = benchapp.durable.engine
        pushed, polling = engine.notifier, NoPush()
        # name -> (notifier, longest poll interval: None = durable_result_poll_max)
        variants = {f"push ({pushed.name})": (pushed, None), "polling": (polling, None), FLOOR: (polling, 0.001)}
        out: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(runs + 2):  # two warm-up rounds
            order = list(variants.items())
            k = i % len(order)  # rotate: no variant always runs right after another
            for name, (notifier, max_poll) in order[k:] + order[:k]:
                engine.notifier = notifier
                h = benchapp.sequential.start(steps)
                value = engine.wait(h.id, timeout=60, max_poll=max_poll).get("result")
                returned = time.time()
                if value != steps:
                    raise AssertionError(f"expected {steps}, got {value!r}")
                ex = engine.store.read(h.id, "exec")
                assert ex is not None
                if i >= 2:
                    out[name].append(returned - float(ex["completed_at"]))
        engine.notifier = pushed
        return out
    except BaseException:
        print(f"worker log (tail):\n{worker.log_tail()}")
        raise
    finally:
        worker.stop()
        benchapp.durable.shutdown()


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    print(f"{machine()} at the start", flush=True)
    results: dict[str, list[float]] = {}
    with bench_env("latency") as env:
        for name, ts in _phase(env, env.store_url, args.runs, args.steps, args.concurrency).items():
            results[f"sqlite store, {name}"] = ts
        if not args.no_postgres:
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            sep = "&" if "?" in PG_BASE else "?"
            try:
                pg_url = f"{PG_BASE}{sep}schema={schema}"
                for name, ts in _phase(env, pg_url, args.runs, args.steps, args.concurrency).items():
                    results[f"postgres store, {name}"] = ts
            finally:
                _drop_schema(schema)
    rows = [
        [name, len(ts), fmt_ms(percentile(ts, 50)), fmt_ms(percentile(ts, 90)), fmt_ms(percentile(ts, 99)),
         fmt_ms(max(ts))]
        for name, ts in results.items()
    ]  # fmt: skip
    print(
        f"\nresult latency: sequential({args.steps}) on 1 worker (prefork -c {args.concurrency}), Redis broker and"
        f" result backend; {args.runs} interleaved runs per variant after 2 warm-up rounds"
    )
    print_table(
        ["variant", "runs", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        rows,
        title="handle.result() return - exec completed_at (after the worker's commit)",
    )
    p50 = {name: percentile(ts, 50) * 1000 for name, ts in results.items()}
    print(f"\nrun time {time.perf_counter() - t_start:.1f} s; {machine()} at the end")
    head = p50["sqlite store, push (redis)"]
    extra = ""
    if "postgres store, push (postgres)" in p50:
        extra = (
            f"; postgres store, LISTEN/NOTIFY: {p50['postgres store, push (postgres)']:.2f} ms,"
            f" its 1 ms-poll floor (the commit) {p50['postgres store, ' + FLOOR]:.2f} ms"
        )
    # the headline: the bench's default deployment (SQLite store, Redis broker), as overhead.py
    print(f"result latency p50 <= 2 ms with push (sqlite store, redis: {head:.2f} ms{extra}) -> "
          f"{'PASS' if head <= 2.0 else 'MISS'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="timed runs per variant (default 60)")
    parser.add_argument("--steps", type=int, default=10, help="activities per workflow (default 10)")
    parser.add_argument("--concurrency", type=int, default=2, help="worker prefork concurrency (default 2)")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL phase")
    parser.add_argument("--quick", action="store_true", help="15 runs per variant")
    args = parser.parse_args()
    exit_on_sigterm()
    if args.quick:
        args.runs = 15
    run(args)


if __name__ == "__main__":
    main()
