"""Recovery latency: SIGKILL the worker running an activity; time until the workflow completes
on the surviving worker. Bound: lease TTL + recovery interval + 2 s (the broker's visibility
timeout, an hour on Redis, plays no part).

    python bench/recovery.py [--trials 5] [--lease-ttl 3] [--recovery-interval 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _beat import start_beat  # noqa: E402
from _common import bench_env, exit_on_sigterm, machine, percentile, print_table, start_worker, wait_until  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--lease-ttl", type=float, default=3.0)
    p.add_argument("--recovery-interval", type=float, default=1.0)
    p.add_argument("--activity-ms", type=float, default=30000.0, help="how long the killed attempt would run")
    p.add_argument("--quick", action="store_true", help="3 trials")
    args = p.parse_args()
    if args.quick:
        args.trials = min(args.trials, 3)
    exit_on_sigterm()
    bound = args.lease_ttl + args.recovery_interval + 2.0
    rows = []
    with bench_env("recovery") as env:
        env.env.update(
            BENCH_COUNTER_PREFIX=f"rec-{env.queue}",
            BENCH_LEASE_TTL=str(args.lease_ttl),
            BENCH_HEARTBEAT=str(max(0.2, args.lease_ttl / 3)),
            BENCH_RECOVERY_INTERVAL=str(args.recovery_interval),
        )
        env.apply_to_process()
        import redis
        from apps import chaosapp

        client = redis.Redis.from_url(env.env["BENCH_BROKER_URL"])
        beat = start_beat(env)
        try:
            for trial in range(args.trials):
                # the victim is the only worker when the activity is sent, so it runs there; the
                # survivor is up and idle before the kill, as in a real deployment
                victim = start_worker(env, app="apps.chaosapp", concurrency=1)
                key = f"rec{trial}"
                h = chaosapp.one_long.start(key, args.activity_ms)
                wait_until(lambda key=key: client.get(f"rec-{env.queue}:started:{key}:0"), timeout=30, what="start")
                survivor = start_worker(env, app="apps.chaosapp", concurrency=1)
                os.killpg(victim.proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                victim.proc.wait(10)
                runs = h.result(timeout=bound * 4)
                took = time.monotonic() - killed
                survivor.stop()
                rows.append([trial + 1, f"{took:.2f} s", runs, "yes" if took <= bound else "NO"])
        finally:
            beat.stop()
            for k in client.scan_iter(match=f"rec-{env.queue}:*"):
                client.delete(k)
    times = [float(r[1].split()[0]) for r in rows]
    print_table(
        ["trial", "kill -> completed", "activity runs", "within bound"],
        rows,
        title=f"recovery after SIGKILL mid-activity ({machine()})",
    )
    worst = max(times)
    print(
        f"\nlease TTL {args.lease_ttl:g} s + recovery interval {args.recovery_interval:g} s + 2 s = bound {bound:g} s"
    )
    print(
        f"recovery time p50 {percentile(times, 50):.2f} s, max {worst:.2f} s -> {'PASS' if worst <= bound else 'MISS'}"
    )
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
