"""Breaker's tests for debounced starts (``options(dedup_key=..., debounce=...)``,
engine/starts/debounce.py, engine/starts/dedup.py ``claim``, engine/core.py ``Engine.start``).

Each test asserts the promise of docs/guides/dedup.md ("Debounce"); a failing one names the
cause in its docstring. On ``WorkflowEnvironment``'s fake clock, on SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celery_durable.engine.core as core
from celery_durable import DuplicateStart, Durable
from celery_durable import workflow as wf
from celery_durable.engine.documents.schema import EXEC_ID
from celery_durable.engine.starts.deadlines import START_CLOCK
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("debounce-breaks", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
RAN: list[Any] = []
KEY = "brk:debounce"


@durable.workflow(name="brk.db.a", signals={"go": int})
def job_a(what: str) -> str:
    RAN.append(("a", what))
    got = wf.wait_signal("go", timeout=600) if what.startswith("sig") else None
    wf.sleep(60)
    return f"{what}:{got}" if got is not None else what


@durable.workflow(name="brk.db.b")
def job_b(what: str) -> str:
    RAN.append(("b", what))
    wf.sleep(60)
    return what


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    RAN.clear()
    return WorkflowEnvironment(durable, store=SqliteStore(str(tmp_path / "db.sqlite")))


def _ex(env: WorkflowEnvironment, eid: str) -> dict[str, Any]:
    return dict(env.store.read(eid, EXEC_ID) or {})


# --- breaks ------------------------------------------------------------------------------------


def test_holder_cancelled_while_push_back_reads_frees_the_key(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise: a start with a key whose holder ended takes the key (dedup.py docstring: "the
    owner ended (completed, failed, cancelled) ... take the key"); debounce only changes what
    happens while the holder is *scheduled*.

    Race: the scheduled holder is cancelled after ``claim`` read it (state RUNNING: scheduled
    counts as running) and before ``push_back`` reads it. push_back sees it is no longer
    scheduled and returns False, but ``claim`` then settles the conflict with its stale state
    RUNNING: ``on_conflict='reject'`` raises DuplicateStart naming a *cancelled* execution
    (``return-existing`` would hand back the cancelled one), though nothing holds the key.

    Observed: DuplicateStart(existing=<cancelled holder>). Expected: a new scheduled execution
    with the new input. Cause: celery_durable/engine/starts/dedup.py:200-206 — after
    ``reschedule(owner)`` is False the loop falls through to the on_conflict branch with ``state``
    read before push_back instead of reading the owner again (``continue``)."""
    first = env.start(job_a.options(dedup_key=KEY, debounce=30), "a1")
    real = core.push_back

    def cancelled_first(store: Any, now: float, owner: str, *rest: Any) -> bool:
        env.engine.cancel(owner)  # the holder is cancelled by someone else just now
        return real(store, now, owner, *rest)

    monkeypatch.setattr(core, "push_back", cancelled_first)
    second = env.start(job_a.options(dedup_key=KEY, debounce=30), "a2")
    monkeypatch.undo()
    assert first.status() == "cancelled"
    assert second.id != first.id
    assert second.status() == "scheduled"
    env.advance(30)
    assert RAN == [("a", "a2")]


def test_return_existing_after_holder_cancelled_mid_push_back_returns_a_live_handle(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise: "all callers get its handle" / the workflow runs with the latest input; a caller
    is never handed a dead execution when the key is free.

    Same race as above with ``on_conflict='return-existing'``: the caller gets the handle of the
    cancelled holder, its input is dropped and nothing will ever run it.

    Observed: handle id == cancelled holder, status cancelled, RAN == []. Expected: a new
    execution that runs with "a2". Cause: celery_durable/engine/starts/dedup.py:200-221 (stale
    ``state`` after a failed ``reschedule``)."""
    first = env.start(job_a.options(dedup_key=KEY, debounce=30), "a1")
    real = core.push_back

    def cancelled_first(store: Any, now: float, owner: str, *rest: Any) -> bool:
        env.engine.cancel(owner)
        return real(store, now, owner, *rest)

    monkeypatch.setattr(core, "push_back", cancelled_first)
    second = env.start(job_a.options(dedup_key=KEY, debounce=30, on_conflict="return-existing"), "a2")
    monkeypatch.undo()
    assert second.id != first.id, "handed the cancelled holder"
    env.advance(30)
    assert RAN == [("a", "a2")]


def test_debounced_start_with_the_holders_workflow_id_gives_it_its_input(env: WorkflowEnvironment) -> None:
    """Promise: another debounced start with the same key while it has not started gives that
    scheduled execution its input and moves its start a full quiet period from now.

    With an explicit ``workflow_id`` (the holder's own, the usual way to pin a debounced job's id)
    the second start is "joined" before any claim: its input is dropped and the start not moved.

    Observed: the execution starts at 30 s with "first". Expected: start at 40 s with "second".
    Cause: celery_durable/engine/core.py:199-200 (``dedup is not None and workflow_id is not None
    and joinable(...)`` returns before ``claim``/``push_back``, even for a debounced start)."""
    opts = job_a.options(workflow_id="brk-pinned", dedup_key=KEY, debounce=30)
    first = env.start(opts, "first")
    env.advance(10)
    second = env.start(opts, "second")
    assert second.id == first.id
    assert _ex(env, first.id).get("start_at") == pytest.approx(env.clock.now() + 30)
    env.advance(30)
    assert RAN == [("a", "second")]


def test_debounce_does_not_retime_a_start_delay_holder(env: WorkflowEnvironment) -> None:
    """Promise: what a debounced start moves is a *debounced* (quiet-period) execution; a start
    with the key that is not merged "is an ordinary conflict with its key (on_conflict)".
    Timing's docstring (deadlines.py:76-78): "the delay is a quiet period: a start ... while
    *this one* is still scheduled gives it its input" — i.e. only a start made with ``debounce``.

    A plain ``start_delay`` start (a fixed start time, a fixed input) holding the key is rewritten
    by a later debounced start: its input replaced and its start moved, though its caller never
    asked for a quiet period.

    Observed: the start_delay execution runs with "debounced" at 30 s instead of with "fixed" at
    100 s; the debounced caller gets no DuplicateStart. Expected: DuplicateStart (reject), the
    delayed execution untouched. Cause: celery_durable/engine/starts/debounce.py:41-42 checks
    only ``status == scheduled`` and the workflow name; the exec records nothing of
    ``Timing.debounce`` (deadlines.py:exec_fields), so any scheduled holder is pushed back."""
    fixed = env.start(job_a.options(dedup_key=KEY, start_delay=100), "fixed")
    with pytest.raises(DuplicateStart):
        env.start(job_a.options(dedup_key=KEY, debounce=30), "debounced")
    assert _ex(env, fixed.id).get("payload") == {"args": ["fixed"], "kwargs": {}}
    env.advance(100)
    assert RAN == [("a", "fixed")]


# --- attacks that held (kept as regression checks) --------------------------------------------


def test_other_workflow_same_key_is_a_conflict_not_a_merge(env: WorkflowEnvironment) -> None:
    a = env.start(job_a.options(dedup_key=KEY, debounce=30), "a1")
    with pytest.raises(DuplicateStart):
        env.start(job_b.options(dedup_key=KEY, debounce=30), "b1")
    with pytest.raises(DuplicateStart):
        env.start(job_b.options(dedup_key=KEY, debounce=30, on_conflict="return-existing"), "b1")
    b = env.start(job_b.options(dedup_key=KEY, debounce=30, on_conflict="latest-wins"), "b2")
    assert b.id != a.id and a.status() == "cancelled" and b.status() == "scheduled"
    env.advance(30)
    assert RAN == [("b", "b2")]


def test_non_debounced_start_on_scheduled_holder(env: WorkflowEnvironment) -> None:
    a = env.start(job_a.options(dedup_key=KEY, debounce=30), "a1")
    with pytest.raises(DuplicateStart):
        env.start(job_a.options(dedup_key=KEY), "plain")
    same = env.start(job_a.options(dedup_key=KEY, on_conflict="return-existing"), "plain")
    assert same.id == a.id
    env.advance(30)
    assert RAN == [("a", "a1")]


def test_latest_wins_debounced_merges_while_scheduled(env: WorkflowEnvironment) -> None:
    o = job_a.options(dedup_key=KEY, debounce=30, on_conflict="latest-wins")
    a = env.start(o, "a1")
    env.advance(10)
    b = env.start(o, "a2")
    assert a.id == b.id and a.status() == "scheduled"
    env.advance(30)
    assert RAN == [("a", "a2")]
    c = env.start(o, "a3")  # running now: latest-wins cancels it and starts a scheduled one
    assert c.id != a.id
    env.advance(1)
    assert a.status() == "cancelled" and c.status() == "scheduled"


def test_signal_before_move_is_delivered(env: WorkflowEnvironment) -> None:
    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, "sig-1")
    env.signal(h, "go", 1)
    env.advance(10)
    env.start(o, "sig-2")
    env.advance(30)
    assert RAN == [("a", "sig-2")]
    assert env.result(h) == "sig-2:1"


def test_large_inputs_apart_and_back_repeatedly(env: WorkflowEnvironment) -> None:
    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, "y" * 20_000)
    for i, v in enumerate(["small", "z" * 30_000, "w" * 17_000, "tiny", "q" * 25_000]):
        env.advance(1)
        assert env.start(o, v).id == h.id, i
    env.advance(30)
    assert RAN == [("a", "q" * 25_000)]
    assert env.result(h) == "q" * 25_000


def test_poll_shows_the_moved_start(env: WorkflowEnvironment) -> None:
    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, "a1")
    env.advance(20)
    env.start(o, "a2")
    assert h.poll().start_at == pytest.approx(env.clock.now() + 30)
    assert (env.store.read(h.id, START_CLOCK) or {}).get("due_at") == pytest.approx(env.clock.now() + 30)


def _due(env: WorkflowEnvironment, eid: str) -> None:
    """Move the fake clock to the execution's start without running anything."""
    env.clock.t = float(_ex(env, eid)["start_at"]) + 0.001


def test_push_back_committing_between_fire_reads_and_batch_wins(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start clock fired: it read exec and clock, then a debounced start commits, then its batch:
    the etag guard refuses the fire, which reads again and finds the start moved."""
    from celery_durable.engine.starts.deadlines import fire_exec_clock

    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, "a1")
    _due(env, h.id)
    store = env.engine.store
    real = store.batch
    done: list[str] = []

    def batch(pk: str, ops: list[Any]) -> Any:
        if not done and any(op.doc is not None and op.doc.get("status") == "running" for op in ops):
            done.append(env.engine.start(job_a.definition, ("a2",), {}, dedup=(KEY, o.dedup[1]), timing=o.timing)[0])
        return real(pk, ops)

    monkeypatch.setattr(store, "batch", batch)
    fire_exec_clock(env.engine, h.id, START_CLOCK)
    monkeypatch.undo()
    assert done == [h.id]
    assert _ex(env, h.id).get("status") == "scheduled"
    env.advance(30)
    assert RAN == [("a", "a2")]


def test_fire_committing_during_push_back_makes_the_start_a_conflict(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """push_back read the scheduled exec, the start clock fires before its batch: push_back's
    batch is refused, it reads again, sees it running, and the start is an ordinary conflict
    (return-existing: the running one, with the input it started with)."""
    from celery_durable.engine.starts.deadlines import fire_exec_clock

    o = job_a.options(dedup_key=KEY, debounce=30, on_conflict="return-existing")
    h = env.start(o, "a1")
    store = env.engine.store
    real = store.batch
    fired: list[Any] = []

    def batch(pk: str, ops: list[Any]) -> Any:
        if not fired and any(
            op.doc is not None and op.doc.get("payload") == {"args": ["a2"], "kwargs": {}} for op in ops
        ):
            _due(env, h.id)
            fired.append(fire_exec_clock(env.engine, h.id, START_CLOCK))
        return real(pk, ops)

    monkeypatch.setattr(store, "batch", batch)
    joined = env.start(o, "a2")
    monkeypatch.undo()
    assert joined.id == h.id and h.status() == "running"
    assert RAN == [("a", "a1")]


def test_store_fault_before_push_back_batch_changes_nothing(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_durable.errors import StoreUnavailable

    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, "a1")
    before = _ex(env, h.id)
    store = env.engine.store
    real = store.batch

    def batch(pk: str, ops: list[Any]) -> Any:
        raise StoreUnavailable("down")

    monkeypatch.setattr(store, "batch", batch)
    env.advance(10)
    with pytest.raises(StoreUnavailable):
        env.start(o, "a2")
    monkeypatch.setattr(store, "batch", real)
    after = _ex(env, h.id)
    assert after.get("payload") == before.get("payload") and after.get("start_at") == before.get("start_at")

    # after a commit whose answer was lost, the retried start converges
    def lost(pk: str, ops: list[Any]) -> Any:
        real(pk, ops)
        raise StoreUnavailable("answer lost")

    monkeypatch.setattr(store, "batch", lost)
    with pytest.raises(StoreUnavailable):
        env.start(o, "a3")
    monkeypatch.setattr(store, "batch", real)
    assert env.start(o, "a3").id == h.id
    env.advance(30)
    assert RAN == [("a", "a3")]


def test_terminated_holder_mid_push_back_frees_the_key(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As test_holder_cancelled_while_push_back_reads_frees_the_key, with an operator's
    terminate in the window (same cause: dedup.py:200-206)."""
    first = env.start(job_a.options(dedup_key=KEY, debounce=30), "a1")
    real = core.push_back

    def terminated_first(store: Any, now: float, owner: str, *rest: Any) -> bool:
        first.terminate(by="ops")
        return real(store, now, owner, *rest)

    monkeypatch.setattr(core, "push_back", terminated_first)
    second = env.start(job_a.options(dedup_key=KEY, debounce=30), "a2")
    monkeypatch.undo()
    assert second.id != first.id and second.status() == "scheduled"


@pytest.mark.parametrize(
    "inputs",
    [
        ["sig" + "y" * 20_000, "sig-small"],
        ["sig-small", "sig" + "z" * 20_000],
        ["sig" + "y" * 20_000, "sig-s", "sig" + "q" * 20_000],
    ],
)
def test_signal_drive_caches_partition_then_input_moves(env: WorkflowEnvironment, inputs: list[str]) -> None:
    """A signal to the scheduled execution drives it (cached partition, input apart or inline),
    then debounced starts move its input apart/inline: it runs with the latest."""
    o = job_a.options(dedup_key=KEY, debounce=30)
    h = env.start(o, inputs[0])
    env.signal(h, "go", 7)
    for v in inputs[1:]:
        env.advance(5)
        assert env.start(o, v).id == h.id
    env.advance(30)
    assert RAN == [("a", inputs[-1])]
    assert env.result(h) == f"{inputs[-1]}:7"
