"""Workflow updates in the simulation (harness/sim_updates.py): the seeds that send updates hold
every invariant, the others send none, and invariant 15 can fail. Planted: a validator never run
(invalid requests accepted) and a handler applied twice per request (answers and the replayed
state no longer match one application each). A seed counts only if it passes unbroken. Measured
when written (faults on): the first caught first by seed 7 (a request with amount -1 accepted),
the second by seed 4 (run 0 answered [2, 4])."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.engine.replay import updates
from harness.sim import KNOWN_BUGS, Faults, SimResult, check_seed, run_seed
from harness.sim_updates import updating
from tests.sim.catching import first_caught
from tests.sim.test_sim import OPEN_BUGS

ENABLED = tuple(b for b in KNOWN_BUGS if b not in OPEN_BUGS)
SEEDS = [s for s in range(30) if updating(s)]


def test_updating_seeds_hold_every_invariant() -> None:
    totals: dict[str, int] = {}
    for seed in SEEDS:
        result = check_seed(seed, Faults(), ENABLED)
        for key in ("update_accepted", "update_rejected", "update_checked"):
            totals[key] = totals.get(key, 0) + result.stats.get(key, 0)
    # the workload exercises both outcomes and the replayed state of ended executions
    assert totals["update_accepted"] >= 10 and totals["update_rejected"] >= 5 and totals["update_checked"] >= 5


def test_other_seeds_send_no_update() -> None:
    assert not updating(1) and not any(k.startswith("update_") for k in run_seed(1).stats)


def test_a_validator_never_run_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    register = updates.register

    def without_validator(ctx: Any, name: str, fn: Any, validator: Any) -> None:
        register(ctx, name, fn, None)

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(updates, "register", without_validator)
            return run_seed(seed, Faults.parse("all"), ENABLED)

    caught = first_caught(broken, SEEDS, 15, ENABLED)
    assert caught is not None
    assert any("accepted=True" in v.message for v in caught[1].violations if v.invariant == 15)


def test_a_handler_applied_twice_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    call = updates._call

    def twice(ctx: Any, name: str, role: str, fn: Any, args: Any, kwargs: Any) -> Any:
        if role == "handler":
            call(ctx, name, role, fn, args, kwargs)
        return call(ctx, name, role, fn, args, kwargs)

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(updates, "_call", twice)
            return run_seed(seed, Faults.parse("all"), ENABLED)

    caught = first_caught(broken, SEEDS, 15, ENABLED)
    assert caught is not None
    assert any("answered" in v.message or "rebuilds" in v.message for v in caught[1].violations)
