"""The engine simulation with a forging message source (``harness/sim_forge.py``, issue 23 items 1
and 5): stale deliveries (another reset generation's token, a random one, none, another
activity's name, other arguments) and forged outcome headers (raw, badly sealed, a genuine seal of
another step or marker) at random points, under the simulation's faults -- no step is begun or
recorded from one. With the engine's checks off the same harness finds both kinds at once."""

from __future__ import annotations

from harness.sim_forge import FORGE_INVARIANT, run_forged_seed
from harness.sim_store import Faults, replay_command


def test_forged_and_stale_messages_break_no_invariant() -> None:
    stale = outcomes = 0
    for seed in range(100):
        result = run_forged_seed(seed, Faults())
        assert not result.violations, f"{result.violations[0]} (ForgingSim; {replay_command(seed, Faults())})"
        stale += result.stats.get("forged_stale", 0)
        outcomes += result.stats.get("forged_outcome", 0)
    assert stale > 500 and outcomes > 300  # the boundary was attacked


def test_the_harness_finds_them_with_the_checks_off() -> None:
    found: set[str] = set()
    for seed in range(20):
        for v in run_forged_seed(seed, Faults(), checks=False).violations:
            if v.invariant == FORGE_INVARIANT:
                found.add("outcome" if "outcome" in v.message or "forged value" in v.message else "stale")
    assert found == {"stale", "outcome"}
