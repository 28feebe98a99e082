"""Replay one seed of the deterministic simulation: ``python tests/sim/run.py --seed 1234``
(or ``python -m tests.sim.run --seed 1234``) from the repository root."""

from __future__ import annotations

import sys
from pathlib import Path

# run as a script, the repository root (where harness/ lives) is not on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.sim_main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
