"""The simulation's deadline checks (invariant 11, harness/sim_deadlines.py) can fail: a deadline
clock that never enforces and a delayed start that runs at once are each caught in the first
seeds (a seed counts only if it passes without the planted bug). An early firing is the unit
tests' (tests/engine/test_deadlines.py): the scan only returns clocks due on its clock."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.engine.outcomes import ClockOutcome
from celery_durable.engine.starts import deadlines
from celery_durable.stores.base import Doc
from tests.sim.test_harness_can_fail import first_caught, patched_run

SEEDS = 100


def never_enforced(eng: Any, ex: Any, clock: Doc, now: float) -> ClockOutcome:
    """The deadline's clock settles without timing anything out (a lost enforcement)."""
    return deadlines._settle_only(eng, clock, now)


real_exec_fields = deadlines.exec_fields


def start_at_once(eid: str, timing: Any, cap: Any, now: float) -> tuple[dict[str, Any], list[Doc]]:
    """A delayed start created with its clock due at once (the delay forgotten)."""
    fields, clocks = real_exec_fields(eid, timing, cap, now)
    for clock in clocks:
        if clock["id"] == deadlines.START_CLOCK:
            clock["due_at"] = now
    return fields, clocks


def test_a_deadline_never_enforced_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    found = first_caught(patched_run(monkeypatch, deadlines, "_fire_deadline", never_enforced), seeds=SEEDS)
    assert found is not None, f"no violation in {SEEDS} seeds"
    assert any(v.invariant == 11 for v in found[1].violations), found[1].violations[:3]


def test_a_delayed_start_run_at_once_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # the start clock is due at once, but start_at stays: its fire checks start_at (EARLY) unless
    # that check is gone too, as a real regression would take both
    monkeypatch.setattr(deadlines, "exec_fields", start_at_once)
    import celery_durable.engine.core as core

    monkeypatch.setattr(core, "exec_fields", start_at_once)
    original = deadlines._fire_start

    def no_wait(eng: Any, ex: Any, clock: Doc, now: float) -> ClockOutcome:
        return original(eng, ex, clock, max(now, float(ex.get("start_at") or now)))

    found = first_caught(patched_run(monkeypatch, deadlines, "_fire_start", no_wait), seeds=SEEDS)
    assert found is not None, f"no violation in {SEEDS} seeds"
    assert any(v.invariant == 11 for v in found[1].violations), found[1].violations[:3]
