"""Timer lateness: 200 durable timers of 2 s through a real worker and beat.

Lateness = when the timer fired minus when it was due, read from the store. Measured twice in
one run: with the fast path (a Celery countdown task per short timer; target p99 <= 250 ms)
and with the fast path disabled (beat's clock scan only; bounded by the scan interval).

    python bench/timers.py [--timers 200] [--seconds 2] [--scan-interval 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _beat import start_beat  # noqa: E402
from _common import bench_env, exit_on_sigterm, machine, percentile, print_table, start_worker  # noqa: E402


def measure(args: argparse.Namespace, fast: bool) -> dict[str, float]:
    with bench_env("timers") as env:
        env.env.update(
            BENCH_FAST_TIMER_MAX="60" if fast else "0",
            BENCH_CLOCK_INTERVAL=str(args.scan_interval),
            BENCH_COUNTER_PREFIX=f"timers-{env.queue}",
        )
        env.apply_to_process()
        from apps import chaosapp

        chaosapp.durable.configure(store=env.store_url)
        worker = start_worker(env, app="apps.chaosapp", concurrency=4)
        beat = start_beat(env)
        try:
            handles = [chaosapp.nap.start(args.seconds) for _ in range(args.timers)]
            resumed = [h.result(timeout=120) for h in handles]
            store = chaosapp.durable.store
            fired = []
            for h in handles:
                marker = store.read(h.id, "s:000002")
                result = store.read(h.id, "r:000002")
                assert marker is not None and result is not None
                fired.append(float(result["fired_at"]) - float(marker["fire_at"]))
        finally:
            worker.stop()
            beat.stop()
    return {
        "fired p50": percentile(fired, 50),
        "fired p99": percentile(fired, 99),
        "fired max": max(fired),
        "resumed p50": percentile(resumed, 50),
        "resumed p99": percentile(resumed, 99),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timers", type=int, default=200)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--scan-interval", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="50 timers")
    args = p.parse_args()
    if args.quick:
        args.timers = min(args.timers, 50)
    exit_on_sigterm()
    t0 = time.monotonic()
    fast = measure(args, fast=True)
    scan = measure(args, fast=False)
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    print_table(
        ["path", "fired p50", "fired p99", "fired max", "workflow resumed p50", "resumed p99"],
        [
            ["fast path (countdown task)", ms(fast["fired p50"]), ms(fast["fired p99"]), ms(fast["fired max"]),
             ms(fast["resumed p50"]), ms(fast["resumed p99"])],
            [f"beat scan only ({args.scan_interval:g} s)", ms(scan["fired p50"]), ms(scan["fired p99"]),
             ms(scan["fired max"]), ms(scan["resumed p50"]), ms(scan["resumed p99"])],
        ],
        title=f"{args.timers} timers of {args.seconds:g} s, 1 worker x 4 + beat, Redis, SQLite ({machine()})",
    )  # fmt: skip
    ok_fast = fast["fired p99"] <= 0.25
    ok_scan = scan["fired max"] <= args.scan_interval + 1.0
    print(f"\nfast path p99 {fast['fired p99'] * 1000:.0f} ms (target <= 250 ms): {'PASS' if ok_fast else 'MISS'}")
    print(
        f"scan only max {scan['fired max'] * 1000:.0f} ms (bound scan interval + 1 s): {'PASS' if ok_scan else 'MISS'}"
    )
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0 if ok_fast and ok_scan else 1


if __name__ == "__main__":
    sys.exit(main())
