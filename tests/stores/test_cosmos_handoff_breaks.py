"""Breaker: the Cosmos due-index handoff can hide a due document behind another holder.

``DueIndex.relies`` / ``_holder`` identify "the document relying on an entry" by (kind, at) only.
Two different entries of one partition may share (kind, at) (two documents created due at the same
instant), so the holder lookup of a handed entry can return another document, not yet due (it was
pushed forward by a trusted replace), and the scan then keeps the entry and reports nothing: the
document the entry was handed to is due but not returned by ``scan_due``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.stores import DueRef, Op, store_from_url
from celery_durable.stores.cosmos.store import CosmosStore

pytestmark = [pytest.mark.cosmos, pytest.mark.foreign_documents]


@pytest.fixture
def store(cosmos_url: str) -> Iterator[CosmosStore]:
    s = store_from_url(cosmos_url)
    assert isinstance(s, CosmosStore)
    yield s
    s.close()


def doc(pk: str, doc_id: str, due_at: float | None) -> dict[str, Any]:
    d: dict[str, Any] = {"pk": pk, "id": doc_id}
    if due_at is not None:
        d.update(due_kind="activity", due_at=due_at)
    return d


@pytest.mark.parametrize("other_id", ["a:lease", "z:lease"])
def test_a_handed_entry_sharing_its_due_time_with_another_documents_entry_is_not_lost(
    store: CosmosStore, other_id: str
) -> None:
    pk = f"h-{other_id[0]}"
    t1 = time.time() + 60
    # two documents of one execution due at the same instant (e.g. created by one step commit)
    etag_a = store.create(doc(pk, "s:1", t1))
    etag_x = store.create(doc(pk, other_id, t1))
    assert etag_a is not None and etag_x is not None
    # the other one is pushed forward (a heartbeat): it keeps its own entry (trusted)
    store.replace(doc(pk, other_id, t1 + 200), if_match=etag_x)
    # a step commit settles s:1 and creates s:2 due at t1: s:2 takes s:1's entry
    store.batch(pk, [Op.replace(doc(pk, "s:1", None), etag_a), Op.create(doc(pk, "s:2", t1))])
    # at t1 + 10, s:2 is due (and the other one is not)
    for _ in range(3):
        assert store.scan_due("activity", t1 + 10) == [DueRef(pk, "s:2", t1)]


@pytest.mark.parametrize("later_first", [False, True])
def test_an_entry_handed_twice_does_not_hide_the_taker_that_is_due(store: CosmosStore, later_first: bool) -> None:
    """ "One taker per entry" does not hold: a document that handed its entry over and is later
    due again at the same instant writes the same entry id again (entry_id(pk, id, at)) and can
    hand it over a second time. The holder lookup then returns one of two takers; when it is the
    one not yet due, the due one is not reported."""
    pk = f"t-{int(later_first)}"
    t1 = time.time() + 60
    dues = {"s:2": t1 + 200, "s:3": t1} if later_first else {"s:2": t1, "s:3": t1 + 200}
    etag = store.create(doc(pk, "s:1", t1))
    assert etag is not None
    etag = store.batch(pk, [Op.replace(doc(pk, "s:1", None), etag), Op.create(doc(pk, "s:2", dues["s:2"]))])[0]
    assert etag is not None
    # s:1 is due again at the same instant (e.g. a retried step re-arming the same deadline)
    etag = store.replace(doc(pk, "s:1", t1), if_match=etag)
    # ...and is settled again by a step commit creating another marker
    store.batch(pk, [Op.replace(doc(pk, "s:1", None), etag), Op.create(doc(pk, "s:3", dues["s:3"]))])
    due = "s:3" if later_first else "s:2"
    for _ in range(3):
        assert store.scan_due("activity", t1 + 10) == [DueRef(pk, due, t1)]


def test_a_handed_entry_is_not_hidden_by_its_target_falling_due_again(store: CosmosStore) -> None:
    """The scan reports an entry's target when it is due, without looking for the document the
    entry was handed to (needs_holder only looks on a "delete" verdict or a ``_gx`` mark, and a
    replace giving the target a due time again drops its ``_gx``). Both are due; one is reported."""
    pk = "again"
    t1 = time.time() + 60
    etag = store.create(doc(pk, "s:1", t1))
    assert etag is not None
    etag = store.batch(pk, [Op.replace(doc(pk, "s:1", None), etag), Op.create(doc(pk, "s:2", t1))])[0]
    assert etag is not None
    # s:1 gets a due time again (its own, new entry)
    store.replace(doc(pk, "s:1", t1 + 5), if_match=etag)
    got = store.scan_due("activity", t1 + 10)
    assert set(got) == {DueRef(pk, "s:1", t1 + 5), DueRef(pk, "s:2", t1)}


def test_a_handed_entry_is_not_hidden_by_its_target_recreated_due(store: CosmosStore) -> None:
    """The same with the target deleted and created again (ids are reused) with a due time."""
    pk = "recreated"
    t1 = time.time() + 60
    etag = store.create(doc(pk, "s:1", t1))
    assert etag is not None
    store.batch(pk, [Op.replace(doc(pk, "s:1", None), etag), Op.create(doc(pk, "s:2", t1))])
    assert store.delete(pk, "s:1")
    assert store.create(doc(pk, "s:1", t1 + 5)) is not None
    got = store.scan_due("activity", t1 + 10)
    assert set(got) == {DueRef(pk, "s:1", t1 + 5), DueRef(pk, "s:2", t1)}
