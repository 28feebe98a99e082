"""Deterministic simulation: many seeds of the real engine under injected faults (issue 10 §3).

Each seed runs the workload (sequential activities, gather, timers, signals with timeouts,
children, cancel with Saga compensation, continue-as-new) on 3 simulated workers sharing one
in-memory store, with store faults, worker crashes, lost/duplicated/delayed/reordered messages,
skewed clocks, preemption inside store calls, and live workflow instances (engine/replay/sticky.py)
evicted or left behind by a move to another thread, then heals and checks the invariants
(``harness.sim``). Target: 0 violations.

    python bench/sim.py --seeds 10000
    python bench/sim.py --seeds 1000 --faults crash,lose --known-bugs signal_timeout_race
    python bench/sim.py --seeds 300 --forge   # plus stale and forged activity messages (sim_forge.py)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.sim import (  # noqa: E402
    FAULT_KINDS,
    KNOWN_BUGS,
    Faults,
    parse_known_bugs,
    replay_command,
    run_seed,
)
from harness.sim_forge import run_forged_seed  # noqa: E402
from harness.sim_store import OPEN_BUGS  # noqa: E402

ROWS = (
    ("store unavailable before the call", "store_before"),
    ("store unavailable after it applied", "store_after"),
    ("worker crashes", "crash"),
    ("messages lost", "lost"),
    ("messages duplicated", "duplicated"),
    ("messages delayed", "delayed"),
    ("preemptions inside a store call", "preempt"),
    ("live workflow instances evicted", "sticky_evict"),
    ("workers moved to another pool thread", "sticky_thread"),
    ("messages delivered", "delivered"),
    ("activities kept, unsent (eager activities)", "eager_kept"),
    ("activity bodies run", "bodies"),
    ("client calls retried", "client_retry"),
    ("stale activity messages forged (--forge)", "forged_stale"),
    ("outcome headers forged (--forge)", "forged_outcome"),
    ("operator resets / retries / resumes", ("ops_reset", "ops_retry", "ops_resume")),
    ("operator calls that returned", "ops_returned"),
    ("operator rewrites recorded as pending (wider than a batch)", "ops_pending_written"),
    ("operator calls killed mid-operation", "ops_abandoned"),
    ("operator calls refused (not applicable)", "ops_refused"),
    ("operator calls that got a store error", "ops_store_error"),
    (
        "pauses / unpauses returned / batch pauses (sim_pause.py)",
        ("pause_returned", "unpause_returned", "batch_pause_done"),
    ),
    (
        "batches started: cancel / terminate / signal / retry / resume (sim_batch.py)",
        tuple(f"batch_{a}_started" for a in ("cancel", "terminate", "signal", "retry", "resume")),
    ),
    (
        "executions the batches acted on, in the same order",
        tuple(f"batch_{a}_acted" for a in ("cancel", "terminate", "signal", "retry", "resume")),
    ),
    (
        "batches with a page run twice / executions a batch's action refused",
        ("batch_page_twice", "batch_refused OperationRefused"),
    ),
    (
        "limited executions queued / started / cancelled queued / slots freed late",
        ("wf_queued_written", "wf_limited_started", "wf_cancel_queued", "wf_slot_freed_late"),
    ),
    (
        "dedup-key starts: reject / return-existing / latest-wins returned",
        ("keyed_reject_returned", "keyed_return-existing_returned", "keyed_latest-wins_returned"),
    ),
    (
        "dedup-key starts refused / starter died / store error",
        ("keyed_refused", "keyed_starter_died", "keyed_store_error"),
    ),
)


def print_table(rows: Sequence[tuple[str, object]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        width = max(len(k) for k, _ in rows)
        vwidth = max(len(str(v)) for _, v in rows)
        print(f"{'':{width}}  {'':>{vwidth}}".rstrip())
        for key, value in rows:
            print(f"{key:<{width}}  {value!s:>{vwidth}}")
        return
    table = Table(title="deterministic simulation")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, str(value))
    Console().print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--faults", default="all", help=f"all, none or a comma list of {', '.join(FAULT_KINDS)}")
    parser.add_argument(
        "--known-bugs",
        default="fixed",
        help=f"fixed (default: all but the open ones: {', '.join(OPEN_BUGS) or 'none'}), all, none or a comma list of: "
        + ", ".join(KNOWN_BUGS),
    )
    parser.add_argument("--show", type=int, default=5, help="print this many failing seeds")
    parser.add_argument("--forge", action="store_true", help="add stale and forged activity messages")
    args = parser.parse_args()
    faults = Faults.parse(args.faults)
    fixed = [b for b in KNOWN_BUGS if b not in OPEN_BUGS]
    bugs = fixed if args.known_bugs == "fixed" else parse_known_bugs(args.known_bugs)
    one, five, _ = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {one:.2f} (1 min) {five:.2f} (5 min)")
    totals: dict[str, int] = {}
    workflows = violations = failing = 0
    tolerated: dict[str, int] = {}
    by_invariant: dict[int, int] = {}
    started = time.perf_counter()
    for seed in range(args.start, args.start + args.seeds):
        result = run_forged_seed(seed, faults, known_bugs=bugs) if args.forge else run_seed(seed, faults, bugs)
        workflows += result.workflows
        for key, n in result.stats.items():
            totals[key] = totals.get(key, 0) + n
        for bug, _ in result.tolerated:
            tolerated[bug] = tolerated.get(bug, 0) + 1
        if result.violations:
            failing += 1
            violations += len(result.violations)
            for v in result.violations:
                by_invariant[v.invariant] = by_invariant.get(v.invariant, 0) + 1
            if failing <= args.show:
                print(f"seed {seed}: {result.violations[0]}\n  replay: {replay_command(seed, faults, bugs)}")
    seconds = time.perf_counter() - started
    rows: list[tuple[str, object]] = [
        ("seeds run", args.seeds),
        ("faults", faults.spec()),
        ("known-bug triggers on", ",".join(bugs) or "none"),
        ("workflows (top level)", workflows),
    ]
    rows += [
        (label, totals.get(key, 0) if isinstance(key, str) else " / ".join(str(totals.get(k, 0)) for k in key))
        for label, key in ROWS
    ]
    rows += [(f"violations of invariant {k}", n) for k, n in sorted(by_invariant.items())]
    rows += [(f"tolerated: signature of open bug {b}", n) for b, n in sorted(tolerated.items())]
    rows += [("invariant violations", violations), ("failing seeds", failing), ("seconds", f"{seconds:.1f}")]
    rows += [("seeds/s", f"{args.seeds / seconds:.1f}")]
    print_table(rows)
    verdict = "PASS" if violations == 0 else "MISS"
    print(f"sim: {violations} violations over {args.seeds} seeds -> {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
