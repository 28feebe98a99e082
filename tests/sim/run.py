"""Replay one seed of the deterministic simulation: ``python -m tests.sim.run --seed 1234``."""

from __future__ import annotations

import sys

from harness.sim import main

if __name__ == "__main__":
    sys.exit(main())
