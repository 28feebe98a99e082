"""The outbox simulation with forged and stale read-ahead hints (``outbox_sim_forge``): the
``after`` hint naming rows of any key in any order (read ahead, then used blind by the drain's
settles while they change), adopt headers of earlier unknown claims replayed on other messages and
attempts, and bulk enqueues (whose wake-up message carries the hint) -- no invariant breaks."""

from __future__ import annotations

import pytest

from harness.outbox_sim_forge import run_forged
from harness.outbox_sim_parts import Faults, replay_command


@pytest.mark.parametrize("faults", [Faults(), Faults(before=0.08, after=0.08)], ids=["default", "store-errors"])
def test_forged_and_stale_hints_break_no_invariant(faults: Faults) -> None:
    forged = unknown = 0
    for seed in range(60):
        result = run_forged(seed, faults)
        assert not result.violations, f"{result.violations[0]} (ForgingSim; {replay_command(seed, faults)})"
        forged += result.stats.get("forged", 0)
        unknown += result.stats.get("claims_unknown", 0)
    assert forged > 100  # the hints were attacked
    if faults.after > 0.05:
        assert unknown > 0  # and adopt headers were replayed
