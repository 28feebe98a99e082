"""The simulation's command line: ``python tests/sim/run.py --seed 1234`` (one seed, or ``--seeds N``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from harness.sim import FAULT_KINDS, KNOWN_BUGS, Faults, parse_known_bugs, replay_command, run_seed

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the deterministic simulation for one seed (or a range).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    parser.add_argument("--faults", default="all", help=f"all, none or a comma list of {', '.join(FAULT_KINDS)}")
    parser.add_argument(
        "--known-bugs", default="all", help=f"all (default), none or a comma list of: {', '.join(KNOWN_BUGS)}"
    )
    args = parser.parse_args(argv)
    faults = Faults.parse(args.faults)
    bugs = parse_known_bugs(args.known_bugs)
    failed = 0
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(seed, faults, bugs)
        if result.violations:
            failed += 1
            for v in result.violations:
                print(f"seed {seed}: {v}")
            print(f"replay: {replay_command(seed, faults, bugs)}")
        elif args.seeds == 1:
            print(f"seed {seed}: ok {json.dumps(result.stats, sort_keys=True)}")
        for bug, v in result.tolerated:
            print(f"seed {seed}: tolerated ({bug} is open): {v}")
    print(f"{args.seeds} seed(s), {failed} failing, {time.perf_counter() - started:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
