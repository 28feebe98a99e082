"""The simulation's operator calls (harness/sim_ops.py) can fail: with roll-forward disabled, or
with the old commit (delete batches first, the reopen last, nothing recording the op), seeds
that pass today violate invariant 8. A seed counts only if it passes unbroken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_durable.engine.admin import operator as admin_mod
from celery_durable.engine.drive.partition_cache import bump_generation
from celery_durable.stores.base import Doc, Op, strip_reserved
from harness.sim import KNOWN_BUGS, Faults, SimResult, run_seed
from tests.sim.test_sim import OPEN_BUGS

SEEDS = 300
ENABLED = tuple(b for b in KNOWN_BUGS if b not in OPEN_BUGS)


def first_caught(run: Callable[[int], SimResult], seeds: int = SEEDS) -> tuple[int, SimResult] | None:
    for seed in range(seeds):
        broken = run(seed)
        if broken.violations and run_seed(seed, Faults(), ENABLED).ok:
            return seed, broken
    return None


def _no(*_: Any) -> bool:
    return False


def test_ops_left_half_done_are_caught_when_nobody_rolls_them_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver, the recovery scan and the next admin call no longer finish a pending op (the
    op's own process still finishes it when it is not killed)."""

    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr("celery_durable.engine.drive.driver.settle", _no)
            m.setattr("celery_durable.engine.drive.recovery.finish", _no)
            m.setattr("celery_durable.engine.admin.operator.settle", _no)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken)
    assert found is not None, f"no violation in {SEEDS} seeds"
    # an op left half done shows as itself (8) or as the execution it leaves stranded (5, 1)
    assert any(v.invariant in (1, 5, 8) for v in found[1].violations), found[1].violations


def legacy_commit(eng: Any, ex: Doc, docs: dict[str, Doc], rewrite: Any, final: dict[str, Any], *_: Any) -> str:
    """The commit before pending ops: delete batches first, the reopen (and the op record) last."""
    ops = [Op.delete(d["id"], d["_etag"]) for d in rewrite.deletes]
    ops += [Op.replace(strip_reserved(d), d["_etag"]) for d in rewrite.replaces]
    ops += [Op.create(d) for d in rewrite.creates]
    room = eng.store.max_batch_ops - 1
    chunks = [ops[i : i + room] for i in range(0, len(ops), room)] or [[]]
    body, etag = ex, ex["_etag"]
    try:
        for i, chunk in enumerate(chunks):
            new = bump_generation(body) | (final if i == len(chunks) - 1 else {})
            etag = str(eng.store.batch(ex["pk"], [*chunk, Op.replace(new, etag)])[-1])
            body = new
    finally:
        eng.cache.invalidate(ex["pk"])
    return ""


def test_the_old_commit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(seed: int) -> SimResult:
        with monkeypatch.context() as m:
            m.setattr(admin_mod, "commit", legacy_commit)
            return run_seed(seed, Faults(), ENABLED)

    found = first_caught(broken)
    assert found is not None, f"no violation in {SEEDS} seeds"
    assert any(v.invariant == 8 for v in found[1].violations), found[1].violations
