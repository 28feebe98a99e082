"""Chaos: workflows on 2 worker processes while a random worker is SIGKILLed every ~2 s.

Each workflow runs N sequential activities whose results are a pure function of their inputs,
so the fault-free result is known. Reports completed / lost / duplicate activity executions /
results equal to the fault-free run. Target: all completed, 0 lost, results equal.

    python bench/chaos.py                      # 200 workflows x 5 activities, SQLite, Redis broker
    python bench/chaos.py --store cosmos --workflows 40
    python bench/chaos.py --store postgres     # a fresh schema in $BENCH_POSTGRES_URL, dropped at the end
    python bench/chaos.py --store cosmos --replica-lag-ms 300 --quick   # reads may be stale (Session)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _beat import start_beat  # noqa: E402
from _common import BenchEnv, Worker, bench_env, exit_on_sigterm, machine, print_table, start_worker  # noqa: E402


def kill(worker: Worker) -> None:
    try:
        os.killpg(worker.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.proc.wait(10)


def run(env: BenchEnv, args: argparse.Namespace) -> bool:
    import redis
    from apps import chaosapp

    prefix = env.env["BENCH_COUNTER_PREFIX"]
    # at INFO on Cosmos (with or without replica lag, so the two compare): each stale-read retry
    # and each recovery scan's re-sends are log lines (counted below)
    level = "INFO" if args.store == "cosmos" else "WARNING"
    workers = [start_worker(env, app="apps.chaosapp", concurrency=2, loglevel=level) for _ in range(2)]
    beats = [start_beat(env)]
    kills = 0
    done = threading.Event()
    lock = threading.Lock()
    rng = random.Random(args.seed)

    def killer() -> None:
        nonlocal kills
        while not done.wait(rng.uniform(0.5, 1.5) * args.kill_every):
            idx = rng.randrange(len(workers))
            with lock:
                kill(workers[idx])
                kills += 1
                if done.is_set():
                    return
                workers[idx] = start_worker(env, app="apps.chaosapp", concurrency=2, loglevel=level)

    t0 = time.monotonic()
    handles = [
        chaosapp.pipeline.start(f"wf{i}", args.steps, args.ms, _workflow_id=f"chaos-{i}") for i in range(args.workflows)
    ]
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    deadline = time.monotonic() + args.timeout
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        statuses = {h.id: h.status() for h in handles}
        if all(s != "running" for s in statuses.values()):
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    done.set()
    thread.join(60)
    try:
        completed = [h for h in handles if statuses.get(h.id) == "completed"]
        results_equal = all(
            h.result(timeout=0) == [chaosapp.expected(f"wf{i}", j) for j in range(args.steps)]
            for i, h in enumerate(handles)
            if h in completed
        )
        client = redis.Redis.from_url(env.env["BENCH_BROKER_URL"])
        runs = [
            int(client.get(f"{prefix}:runs:wf{i}:{j}") or 0) for i in range(args.workflows) for j in range(args.steps)
        ]
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    finally:
        for w in workers + beats:
            w.stop()
    logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("*.log"))
    if args.keep_logs:
        keep = Path(args.keep_logs)
        keep.mkdir(parents=True, exist_ok=True)
        for log in env.tmp.glob("*.log"):
            shutil.copy(log, keep / log.name)
    stale_retries = logs.count("may be a stale read, retrying")
    stale_left = logs.count("; left to recovery")
    resent = sum(
        int(n) for n in re.findall(r"celery_durable\.recover\[[^]]*\] succeeded in [^{]*\{[^}]*'resent': (\d+)", logs)
    )
    found_done = len(re.findall(r"not run: (?:duplicate|execution is completed)", logs))
    total = args.workflows * args.steps
    duplicates = sum(max(0, r - 1) for r in runs)
    never = sum(1 for r in runs if r == 0)
    lost = args.workflows - len(completed)
    print_table(
        ["measure", "value"],
        [
            ["workflows x activities", f"{args.workflows} x {args.steps}"],
            [
                "store",
                args.store
                + (f" (replica lag {args.replica_lag_ms} ms)" if args.replica_lag_ms else "")
                + (" (account)" if args.cosmos_url else ""),
            ],
            ["activity queue timeout", f"{args.queue_timeout:g} s"],
            ["workers SIGKILLed", kills],
            ["elapsed", f"{elapsed:.1f} s"],
            ["completed", f"{len(completed)}/{args.workflows}"],
            ["lost", lost],
            ["activity executions", f"{sum(runs)} for {total} steps"],
            ["duplicate activity executions", duplicates],
            ["steps never executed", never],
            ["results equal to a fault-free run", "yes" if results_equal and not lost else "NO"],
            *(
                [
                    ["deliveries re-sent after a maybe-stale read", stale_retries],
                    ["  of which left to recovery", stale_left],
                    ["activities re-sent by the recovery scan", resent],
                    ["deliveries that found their step done", found_done],
                ]
                if args.store == "cosmos"
                else []
            ),
        ],
        title=f"chaos ({machine()})",
    )
    ok = lost == 0 and results_equal
    print(
        f"\n{len(completed)}/{args.workflows} completed, {lost} lost, results equal: {results_equal}"
        f"{'' if args.eager_activities is None else f' (eager activities {args.eager_activities})'} -> "
        f"{'PASS' if ok else 'MISS'}"
    )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workflows", type=int, default=200)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ms", type=float, default=20.0, help="duration of each activity")
    p.add_argument("--kill-every", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--store", choices=["sqlite", "postgres", "cosmos"], default="sqlite")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--replica-lag-ms", type=int, default=0, help="cosmos: reads without a fresh session token may be stale"
    )
    p.add_argument(
        "--eager-activities",
        type=int,
        default=None,
        help="durable_eager_activities of the workers (default: the library's, 16; 0: off)",
    )
    p.add_argument("--quick", action="store_true", help="40 workflows")
    p.add_argument("--keep-logs", metavar="DIR", help="copy the worker and beat logs into DIR")
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="durable_activity_queue_timeout: an activity not started this long after its send is re-sent "
        "(default 5 s; 60 s on Cosmos, whose test server serves ~4 steps/s on 2 cores, so 200 queued "
        "workflows wait ~50 s: a shorter timeout re-sends every waiting activity)",
    )
    p.add_argument(
        "--cosmos-url",
        default=os.environ.get("DURABLE_TEST_COSMOS_URL"),
        help="cosmos: a real account or the official emulator instead of the test server (default: "
        "$DURABLE_TEST_COSMOS_URL; put the key in $DURABLE_COSMOS_KEY, not on the command line); "
        "a fresh container, deleted at the end",
    )
    args = p.parse_args()
    if args.quick:
        args.workflows = min(args.workflows, 40)
    if args.store != "cosmos":
        args.cosmos_url = None
    if args.cosmos_url and args.replica_lag_ms:
        p.error("--replica-lag-ms is a mode of the test server: not with --cosmos-url")
    exit_on_sigterm()
    with bench_env("chaos", store="postgres" if args.store == "postgres" else "sqlite") as env:
        env.env["BENCH_COUNTER_PREFIX"] = f"chaos-{env.queue}"
        if args.eager_activities is not None:
            env.env["BENCH_EAGER_ACTIVITIES"] = str(args.eager_activities)
        if args.queue_timeout is None:
            args.queue_timeout = 60.0 if args.store == "cosmos" else 5.0
        env.env["BENCH_QUEUE_TIMEOUT"] = str(args.queue_timeout)
        server = None
        account = contextlib.ExitStack()
        if args.cosmos_url:
            from harness.cosmos_account import describe, fresh_container

            env.env["DURABLE_STORE_URL"] = account.enter_context(fresh_container(args.cosmos_url, prefix="chaos"))
            print(f"on {describe(env.env['DURABLE_STORE_URL'])} (deleted at the end)")
        elif args.store == "cosmos":
            from celery_durable.testing.cosmos_server import CosmosTestServer

            server = CosmosTestServer(replica_lag_ms=args.replica_lag_ms).start()
            env.env["DURABLE_STORE_URL"] = server.url_for("bench", f"chaos{int(time.time())}")
        env.apply_to_process()
        try:
            return 0 if run(env, args) else 1
        finally:
            account.close()
            if server is not None:
                if args.replica_lag_ms:
                    stale = server.stats().get("staleReads")
                    print(f"replica lag {args.replica_lag_ms} ms: {stale} reads served stale by the test server")
                server.stop()


if __name__ == "__main__":
    sys.exit(main())
