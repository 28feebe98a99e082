"""An ended attempt's slot given back in the commit that records its outcome
(engine/limits/leaving.py, ``Store.batch_with``): no store call of its own, all or nothing with
the outcome, and given back apart whenever that commit did not carry it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from celery_durable import Limit
from celery_durable.engine.documents.model import result_id
from celery_durable.engine.limits.spec import limit_pk
from celery_durable.errors import StoreUnavailable
from celery_durable.stores.base import Op, Rewrite, Store
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.counting import CountingStore
from tests.engine.inprocess import InProcess
from tests.engine.test_limits import _begin, _finish, _limit_doc, _queued, _start
from tests.engine.test_limits import _world as limits_world


def _world(store: Store) -> InProcess:
    return limits_world(Limit("stripe", max_running=1, key=lambda key, n: key), fan=0, store=store)


def _finished(w: InProcess, store: CountingStore, attempt: Any) -> dict[str, int]:
    """Finish ``attempt``; the store calls that took, by kind."""
    before = dict(store.counts)
    _finish(w, attempt)
    return {op: n - before.get(op, 0) for op, n in store.counts.items() if n != before.get(op, 0)}


@pytest.fixture(params=["memory", "sqlite"])
def counting(request: pytest.FixtureRequest, tmp_path: Any) -> CountingStore:
    inner: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "s.db"))
    return CountingStore(inner)


def test_the_slot_goes_back_in_the_outcomes_commit_with_no_call_of_its_own(counting: CountingStore) -> None:
    assert counting.cross_partition
    w = _world(counting)
    (first,) = _start(w, "e1", 3)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    calls = _finished(w, counting, attempt)
    # the outcome's commit (one batch_with) and the drive's own reads: no read or write of the limit
    assert calls.get("batch_with") == 1 and "replace" not in calls and "read" not in calls, calls
    doc = _limit_doc(w, "stripe", "k")
    assert list(doc["holders"]) == ["e1|0|2"] and [x["q"] for x in doc["waiters"]] == [3]
    assert [r.seq for r in _queued(w)] == [2]  # the next holder sent after the commit


class _FailingBatch(MemoryStore):
    """Fails every batch that carries a rewrite, before applying it."""

    cross_partition = True

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        for r in also:
            r.etag = None
        raise StoreUnavailable("down for the outcome's commit")


def test_an_outcome_not_committed_keeps_the_slot_and_gives_it_back_apart() -> None:
    """The commit carrying the rewrite fails: the outcome is not recorded, and the slot is given
    back in a write of its own (as before), never lost with the failed commit."""
    store = _FailingBatch()
    w = _world(store)
    (first,) = _start(w, "e1", 2)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    with pytest.raises(StoreUnavailable):
        _finish(w, attempt)
    assert store.read("e1", result_id(1, 0)) is None
    doc = _limit_doc(w, "stripe", "k")
    assert list(doc["holders"]) == ["e1|0|2"], doc["holders"]  # freed, and granted on


class _NoCrossPartition(MemoryStore):
    cross_partition = False


def test_a_store_without_cross_partition_batches_gives_the_slot_back_apart() -> None:
    store = CountingStore(_NoCrossPartition())
    assert not store.cross_partition
    w = _world(store)
    (first,) = _start(w, "e1", 2)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    calls = _finished(w, store, attempt)
    assert "batch_with" not in calls and calls.get("replace", 0) >= 1, calls
    assert list(_limit_doc(w, "stripe", "k")["holders"]) == ["e1|0|2"]


def test_an_outcome_already_recorded_still_frees_the_slot(counting: CountingStore) -> None:
    """A duplicate attempt's outcome is dropped by its drive (first writer wins): no batch
    carries the rewrite, and the slot is given back apart."""
    w = _world(counting)
    (first,) = _start(w, "e1", 2)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    winner = w.engine.activities.result_doc(attempt, value="first")
    counting.create(winner)  # recorded meanwhile by another delivery
    _finish(w, attempt)
    assert w.store.read("e1", result_id(1, 0))["value"] == "first"  # type: ignore[index]
    assert list(_limit_doc(w, "stripe", "k")["holders"]) == ["e1|0|2"]


def test_the_limit_document_partition_is_the_rewrites() -> None:
    w = _world(MemoryStore())
    (first,) = _start(w, "e1", 1)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    out = w.engine.limits.leaving(attempt)
    assert out is not None and out.rewrite.pk == limit_pk(out.record)
    w.engine.limits.left(out)  # not committed: given back apart
    assert _limit_doc(w, "stripe", "k")["holders"] == {}
