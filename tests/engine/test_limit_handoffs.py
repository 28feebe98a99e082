"""A freed slot handed to the next step in the process it freed in (engine/limits/grants.py):
a waiter queued at dispatch carries its message, so the hand-off reads nothing; the hand-off's
own begin checks it may still run and, refused for good, gives the slot to the next waiter."""

from __future__ import annotations

from typing import Any

from celery_durable import Limit
from celery_durable.engine.activities.delivery import request_of
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.schema import EXEC_ID, marker_id
from celery_durable.engine.limits.grants import CARRY_BYTES
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.counting import CountingStore
from tests.engine.inprocess import InProcess
from tests.engine.test_limits import _begin, _drives_then_sent, _finish, _limit_doc, _queued, _start, _world


class _Handing:
    """A dispatcher's ``hand_off``: every hand-off is kept (run next here), as a worker's
    delivery keeps one (glue/eager_activities.py)."""

    def __init__(self, w: InProcess) -> None:
        self.kept: list[ActivityRequest] = []
        w.dispatcher.hand_off = self.take  # type: ignore[attr-defined]

    def take(self, request: ActivityRequest) -> bool:
        self.kept.append(request)
        return True


def test_a_waiter_queued_at_dispatch_carries_its_message_when_small() -> None:
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: key), fan=3)
    _start(w, "e1", 3)
    waiters = _limit_doc(w, "stripe", "k")["waiters"]
    docs = w.engine.cache.load("e1")
    for waiter in waiters:
        sent = request_of("e1", docs[marker_id(waiter["q"], 0)], docs[EXEC_ID])
        assert waiter["m"] == {"n": sent.name, "a": sent.args, "k": sent.kwargs, "i": sent.task_id, "w": sent.workflow}


def test_a_large_message_is_not_carried() -> None:
    big = "x" * (CARRY_BYTES + 1)
    w2 = _world(Limit("stripe", max_running=1, key=lambda key, n: "k"), fan=2, keys=[big])
    _start(w2, "e1", 2)
    (waiter,) = _limit_doc(w2, "stripe", "k")["waiters"]
    assert "m" not in waiter


def test_a_hand_off_reads_nothing_and_is_the_message_its_marker_would_send() -> None:
    store = CountingStore(MemoryStore())
    w = _world(Limit("h", max_running=1, key=lambda key, n: key), fan=2, store=store)
    (first,) = _start(w, "e1", 2)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    handing = _Handing(w)
    docs = w.engine.cache.load("e1")
    expected = request_of("e1", docs[marker_id(2, 0)], docs[EXEC_ID])
    record = _marker_limit(w, "e1", first.seq)
    w.engine.cache.invalidate()
    before = dict(store.counts)
    w.engine.limits.release("e1", 0, first.seq, (1, attempt.token), record)
    reads = {op: store.counts[op] - before.get(op, 0) for op in ("query_partition", "read")}
    assert reads == {"query_partition": 0, "read": 0}, reads
    (kept,) = handing.kept
    assert kept.handoff is not None
    assert (kept.execution_id, kept.seq, kept.name, kept.args, kept.task_id, kept.token) == (
        expected.execution_id,
        expected.seq,
        expected.name,
        expected.args,
        expected.task_id,
        expected.token,
    )
    assert _queued(w) == []  # not sent: run next here


def _marker_limit(w: InProcess, eid: str, seq: int) -> dict[str, Any]:
    marker = w.engine.cache.load(eid)[marker_id(seq, 0)]
    return dict(marker["limit"])


def test_a_hand_off_refused_for_good_gives_its_slot_to_the_next_waiter() -> None:
    """The hand-off's execution was cancelled after the grant: its begin (the first read) refuses
    it and the slot goes on to the next waiter, of another execution, at once (not at the
    holder's expiry)."""
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: "k"), fan=2)
    (first,) = _start(w, "e1", 2)  # e1's step 2 waits
    _start(w, "e2", 1)  # e2's step 1 waits behind it
    attempt, _ = _begin(w, first)
    assert attempt is not None
    handing = _Handing(w)
    _finish(w, attempt)  # the slot goes to e1 step 2, handed off here
    (kept,) = handing.kept  # e2's, the fairer (its group has not been served yet)
    other = ("e1", 2) if kept.execution_id == "e2" else ("e2", 1)
    assert f"{kept.execution_id}|0|{kept.seq}" in _limit_doc(w, "stripe", "k")["holders"]
    w.engine.cancel(kept.execution_id)
    _drives_then_sent(w)
    refused, why = w.engine.activities.begin(kept.execution_id, kept.seq, kept.run, handoff=kept.grant())
    assert refused is None and "cancel" in why, why
    doc = _limit_doc(w, "stripe", "k")
    assert list(doc["holders"]) == [f"{other[0]}|0|{other[1]}"], doc["holders"]
    assert [(r.execution_id, r.seq) for r in handing.kept[1:]] == [other]


def test_a_delivery_refused_as_a_plain_message_keeps_the_grant_to_its_scan() -> None:
    """Without ``handoff`` (a message, whose sender checked the step) a refusal frees nothing it
    did not take."""
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: "k"), fan=2)
    (first,) = _start(w, "e1", 1)
    attempt, _ = _begin(w, first)
    assert attempt is not None
    _finish(w, attempt)
    refused, _ = w.engine.activities.begin("e1", first.seq, 0)  # a duplicate: settled
    assert refused is None
