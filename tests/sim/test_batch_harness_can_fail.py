"""Batch operations in the simulation (harness/sim_batch.py): the seeds that run batches hold
every invariant and act, the others start none, and invariant 16 can fail. Planted: a page listed
again acts again (its "done already" check skipped: a cancel or a retry is recorded twice); a
signal batch that sends its value twice; a page that drops its last execution (the next page
starts after it: never acted on). A seed counts only if it passes unbroken."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable.engine.admin import batch as batch_mod
from celery_durable.engine.admin.operator import Admin, ExecutionPage
from harness.sim import KNOWN_BUGS, Faults, SimResult, check_seed, run_seed
from harness.sim_batch import batching
from tests.sim.catching import first_caught
from tests.sim.test_sim import OPEN_BUGS

ENABLED = tuple(b for b in KNOWN_BUGS if b not in OPEN_BUGS)
#: the batching seeds searched
SEEDS = [s for s in range(150) if batching(s)]


def test_batching_seeds_hold_every_invariant_and_act() -> None:
    acted: dict[str, int] = {}
    for seed in SEEDS[:20]:
        for key, n in check_seed(seed, Faults(), ENABLED).stats.items():
            if key.startswith("batch_") and key.endswith("_acted"):
                acted[key] = acted.get(key, 0) + n
    assert all(acted.get(f"batch_{a}_acted", 0) > 0 for a in ("cancel", "terminate", "signal")), acted


def test_other_seeds_start_no_batch() -> None:
    assert not batching(1) and not any(k.endswith("_started") for k in run_seed(1).stats)
    assert any(k.startswith("batch_") and k.endswith("_started") for k in run_seed(2).stats)


def test_a_page_acting_again_on_what_it_did_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_acted`` always says no: a page run again (a retried attempt, a takeover) acts again."""

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(batch_mod, "_acted", lambda *_: False)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken, SEEDS, 16, ENABLED)
    assert found is not None, f"no violation of invariant 16 in seeds {SEEDS}"
    assert any("times" in v.message for v in found[1].violations), found[1].violations


def test_a_signal_batch_sending_twice_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's signal goes once with its id, then again with another."""
    send = batch_mod._signal

    def twice(engine: Any, eid: str, name: str, value: Any, by: str) -> bool:
        first = send(engine, eid, name, value, by)
        return engine.signals.signal(eid, name, value, signal_id=f"{by}:{eid}:again", by=by) and first

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(batch_mod, "_signal", twice)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken, SEEDS, 16, ENABLED)
    assert found is not None, f"no violation of invariant 16 in seeds {SEEDS}"


class _Dropping(Admin):
    """Lists a page without its last execution, its cursor unchanged (the next page starts after it)."""

    def executions(self, *args: Any, **kwargs: Any) -> ExecutionPage:
        page = super().executions(*args, **kwargs)
        return ExecutionPage(page.executions[:-1], page.cursor)


def test_a_page_skipping_an_execution_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(batch_mod, "Admin", _Dropping)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken, SEEDS, 16, ENABLED)
    assert found is not None, f"no violation of invariant 16 in seeds {SEEDS}"
    assert any("skipped" in v.message for v in found[1].violations), found[1].violations
