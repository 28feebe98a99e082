"""Deterministic simulation of the effect outbox: many seeds under injected faults (issue 11).

Each seed runs a random workload (enqueues direct and through transactional intents, repeated
ids with the same or another payload, delayed effects, cancels by id and by key) on 3 simulated
workers and a client sharing one in-memory store, with store errors before and after a write
applied, worker crashes, lost/duplicated/delayed/reordered messages, skewed clocks and
preemption inside store calls; then heals and checks the invariants
(``harness.outbox_sim``). Target: 0 violations.

    python bench/outbox_sim.py                      # 10,000 seeds, all faults
    python bench/outbox_sim.py --seed 42 --faults all --trace
    python bench/outbox_sim.py --seeds 1000 --bugs cancel_frees_key   # the harness must fail
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine, verdict  # noqa: E402
from _common import print_table as plain_table  # noqa: E402

from harness.outbox_sim import (  # noqa: E402
    BUGS,
    FAULT_KINDS,
    INVARIANTS,
    Faults,
    SimResult,
    replay_command,
    run_seed,
)
from harness.outbox_sim_parts import MAX_SKEW  # noqa: E402

#: the invariants (``INVARIANTS`` has them in full) in a table row
SHORT = {
    1: "per-key seq order",
    2: "handlers of a key overlap",
    3: "process-bound started twice",
    4: "left live after healing",
    5: "admitted effect lost",
    6: "unexpected exception",
    7: "idempotent enqueue",
}
assert SHORT.keys() == INVARIANTS.keys()
FAULT_ROWS = (
    ("store unavailable before the call", "store_before"),
    ("store unavailable after it applied", "store_after"),
    ("worker crashes", "crash"),
    ("messages lost", "lost"),
    ("messages duplicated", "duplicated"),
    ("messages delayed (reordered)", "delayed"),
    ("preemptions inside a store call", "preempt"),
    ("enqueuers dead before admitting their intent", "enqueuer_died"),
)
WORK_ROWS = (
    ("enqueues (direct)", "enqueue_direct"),
    ("enqueues (transactional intent)", "enqueue_intent"),
    ("  refused: LaneFull", "lane_full"),
    ("  refused: IdempotencyConflict", "idempotency_conflict"),
    ("rows cancelled by cancel()", "cancels_applied"),
    ("messages delivered", "delivered"),
    ("effects run (handler starts)", "effects_run"),
    ("  claimed by the previous settle (claim_next)", "successors"),
    ("  stopped by a cancel while running", "stopped_cancelled"),
    ("  settled succeeded", "settled_succeeded"),
    ("  settled failed", "settled_failed"),
    ("  settled retry", "settled_retry"),
)


def print_table(rows: Sequence[tuple[str, object]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is optional: the plain table of the other benches
        plain_table(["measure", "value"], rows, title)
        return
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, str(value))
    Console().print(table)


def _run(args: tuple[int, Faults, tuple[str, ...]]) -> SimResult:
    return run_seed(*args)


def one_seed(seed: int, faults: Faults, bugs: tuple[str, ...], trace: bool) -> int:
    """Replay one seed: its trace (with ``--trace``), violations and counters."""
    lines: list[str] | None = [] if trace else None
    result = run_seed(seed, faults, bugs, trace=lines)
    for line in lines or ():
        print(line)
    for v in result.violations:
        print(v)
    print(f"seed {seed}: {len(result.violations)} violations; {dict(sorted(result.stats.items()))}")
    print(f"replay: {replay_command(seed, faults, bugs)}")
    return 1 if result.violations else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10_000)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed")
    parser.add_argument("--trace", action="store_true", help="with --seed: print what happened, step by step")
    parser.add_argument("--faults", default="all", help=f"all, none or a comma list of {', '.join(FAULT_KINDS)}")
    parser.add_argument("--bugs", default="none", help=f"none or a comma list of: {', '.join(BUGS)}")
    parser.add_argument("--jobs", type=int, default=1, help="processes (results do not depend on it)")
    parser.add_argument("--show", type=int, default=5, help="print this many failing seeds")
    args = parser.parse_args()
    faults = Faults.parse(args.faults)
    bugs = tuple(b for b in args.bugs.split(",") if b and b != "none")
    unknown = [b for b in bugs if b not in BUGS]
    if unknown:
        parser.error(f"unknown bugs {unknown}; known: {', '.join(BUGS)}")
    if args.seed is not None:
        return one_seed(args.seed, faults, bugs, args.trace)
    print(machine())
    seeds = range(args.start, args.start + args.seeds)
    totals: dict[str, int] = {}
    by_invariant = dict.fromkeys(INVARIANTS, 0)
    violations = failing = 0
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Inline() as pool:
        for result in pool.map(_run, [(s, faults, bugs) for s in seeds], chunksize=50):
            for key, n in result.stats.items():
                totals[key] = totals.get(key, 0) + n
            if result.violations:
                failing += 1
                violations += len(result.violations)
                for v in result.violations:
                    by_invariant[v.invariant] += 1
                if failing <= args.show:
                    print(f"{result.violations[0]}\n  replay: {replay_command(result.seed, faults, bugs)}")
    seconds = time.perf_counter() - started
    rows: list[tuple[str, object]] = [
        ("seeds run", args.seeds),
        ("faults", faults.spec()),
        ("clock skew between two actors (max, s)", f"{2 * MAX_SKEW * faults.skew:g}"),
        ("reintroduced bugs", ",".join(bugs) or "none"),
    ]
    rows += [(label, totals.get(key, 0)) for label, key in FAULT_ROWS + WORK_ROWS]
    rows += [(f"violations of invariant {k} ({SHORT[k]})", n) for k, n in by_invariant.items()]
    rows += [
        ("failing seeds", failing),
        ("wall time (s)", f"{seconds:.1f}"),
        ("seeds/s", f"{args.seeds / seconds:.1f}"),
    ]
    print_table(rows, "outbox simulation")
    print(verdict("outbox simulation violations", violations, 0, higher_is_better=False))
    return 0 if violations == 0 else 1


class _Inline:
    """``map`` in this process (the default: one core, no pickling)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def map(self, fn: object, items: Sequence[tuple[int, Faults, tuple[str, ...]]], chunksize: int = 1) -> object:
        return (_run(item) for item in items)


if __name__ == "__main__":
    sys.exit(main())
