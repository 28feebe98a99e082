"""The outbox simulation must be able to fail: broken stores and a reintroduced engine bug are caught.

A seed counts only if the same seed passes without the breakage, so what is found is the
breakage, not an unrelated open bug.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import pytest

from celery_durable.engine.outbox import InlineSender, OutboxEngine
from celery_durable.errors import ConflictError
from celery_durable.stores.base import Doc, Op
from celery_durable.stores.memory import MemoryStore
from harness.outbox_sim import BUGS, SimResult, run_seed

SEEDS = 200


class IgnoresIfMatch(MemoryStore):
    """A store whose replace never checks the etag (lost updates)."""

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return super().replace(doc, None)


class PiecemealBatch(MemoryStore):
    """A store whose batch is not all-or-nothing: it applies the ops one by one, each checked on
    its own, and raises at the first that fails, leaving the ones before it applied."""

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._check_batch(pk, ops)
        out: list[str | None] = []
        for op in ops:
            if op.kind == "delete":
                if not self.delete(pk, op.doc_id, op.if_match):
                    raise ConflictError(f"batch delete: {op.doc_id!r} does not exist")
                out.append(None)
                continue
            assert op.doc is not None
            if op.kind == "create":
                etag = self.create(op.doc)
                if etag is None:
                    raise ConflictError(f"batch create: {op.doc_id!r} exists")
                out.append(etag)
            elif op.kind == "replace":
                out.append(self.replace(op.doc, op.if_match))
            else:
                out.append(self.upsert(op.doc))
        return out


def first_caught(run: Callable[[int], SimResult], invariants: Collection[int] = ()) -> tuple[int, SimResult] | None:
    """The first seed whose broken run violates (one of ``invariants``) and whose plain run passes."""
    for seed in range(SEEDS):
        broken = run(seed)
        if any(not invariants or v.invariant in invariants for v in broken.violations) and run_seed(seed).ok:
            return seed, broken
    return None


@pytest.mark.parametrize("store", [IgnoresIfMatch, PiecemealBatch])
def test_a_broken_store_is_caught(store: type[MemoryStore]) -> None:
    found = first_caught(lambda seed: run_seed(seed, store=store()))
    assert found is not None, f"{store.__name__}: not caught in {SEEDS} seeds"


def test_the_cancel_that_frees_its_key_at_once_is_caught() -> None:
    """D1 put back (``OutboxEngine.bugs``): the next row of a key starts while the cancelled
    handler still runs, which is invariant 2 (no two handlers of one key overlap)."""
    assert "bugs" in vars(OutboxEngine(MemoryStore(), InlineSender())), "OutboxEngine has no `bugs` knob"
    found = first_caught(lambda seed: run_seed(seed, bugs=("cancel_frees_key",)), invariants={2})
    assert found is not None, f"D1 (cancel_frees_key) not caught in {SEEDS} seeds"


def test_bug_names_are_documented() -> None:
    assert BUGS and all(isinstance(v, str) and v for v in BUGS.values())
