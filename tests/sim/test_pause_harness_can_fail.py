"""Pause and unpause in the simulation (harness/sim_pause.py): the seeds that pause hold every
invariant, the others make no pause call, and the checks can fail. Planted: a driver that ignores
the pause (its paused branch never taken) breaks invariant 14; an unpause that neither sends a
drive nor sets the exec due leaves executions stranded (invariant 5). A seed counts only if it
passes unbroken. Measured when written: the first caught first by seed 1 (its pause dropped by a
drive's commit, 14 c; seed 5: a step created while paused, 14 a), the second by seed 5."""

from __future__ import annotations

import types
from typing import Any

import pytest

import harness.sim_pause as sim_pause
from celery_durable.engine.admin import pause as pause_mod
from celery_durable.engine.drive import driver
from harness.sim import KNOWN_BUGS, Faults, SimResult, check_seed, run_seed
from harness.sim_pause import pausing
from tests.sim.catching import first_caught
from tests.sim.test_sim import OPEN_BUGS

ENABLED = tuple(b for b in KNOWN_BUGS if b not in OPEN_BUGS)
#: the pausing seeds searched
SEEDS = [s for s in range(60) if pausing(s)]


def test_pausing_seeds_hold_every_invariant() -> None:
    paused = 0
    for seed in SEEDS:
        result = check_seed(seed, Faults(), ENABLED)
        paused += result.stats.get("pause_returned", 0)  # none left paused: invariant 14 (d)
    assert paused >= len(SEEDS) // 2


def test_other_seeds_make_no_pause_call() -> None:
    assert not pausing(2) and not any(k.startswith(("pause_", "unpause_")) for k in run_seed(2).stats)
    assert run_seed(1).stats.get("pause_returned", 0) > 0


def test_a_driver_ignoring_the_pause_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver reads every exec as unpaused: it replays a paused execution, takes new steps and
    its commit drops the flag (invariant 14 a, c)."""
    reborn = getattr(driver, "reborn")  # noqa: B009 - not exported: the name the driver calls

    def unpaused(stored: Any, docs: Any) -> Any:
        ex = reborn(stored, docs)
        return ex | {"paused": None} if ex.get("paused") else ex

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(driver, "reborn", unpaused)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken, SEEDS, 14, ENABLED)
    assert found is not None, f"no violation of invariant 14 in seeds {SEEDS}"


def test_an_unpause_that_neither_drives_nor_sets_the_due_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpaused, nothing drives it again (the pause cleared its recovery due): stranded."""
    unpause = pause_mod.unpause

    def silent(engine: Any, execution_id: str, by: str, reason: str | None = None) -> bool:
        engine.dispatcher.send_drive = lambda *_a, **_k: None
        return unpause(engine, execution_id, by, reason)

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(sim_pause, "unpause", silent)
            m.setattr(pause_mod, "DUE_EXEC", types.SimpleNamespace(value=None))  # due_kind None: never scanned
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken, SEEDS, 5, ENABLED)
    assert found is not None, f"no violation of invariant 5 in seeds {SEEDS}"
