"""Sticky workflow instances (engine/replay/sticky.py): a suspended workflow is resumed, not replayed from
the top, only while everything it saw is unchanged; it decides what a full replay would decide."""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable import workflow as wf
from celery_durable.engine.drive.driver import Driver
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.replay.history import Replay, replay
from celery_durable.engine.replay.sticky import StickyCache
from celery_durable.errors import ConflictError
from celery_durable.stores.base import Doc, strip_reserved
from tests.engine.inprocess import InProcess


class Flow:
    """A sequential workflow of ``n`` activity steps that counts how often its body starts."""

    def __init__(self, env: InProcess, n: int = 4) -> None:
        self.env = env
        self.starts = 0
        self.finally_ran = 0
        act = env.registry.add_activity("sticky.add", lambda a, b: a + b)

        def flow(n: int) -> int:
            self.starts += 1
            total = 0
            try:
                for i in range(n):
                    total = require_context("a").call_activity(act.name, act.codec, (total, i), {}).result()
            finally:
                self.finally_ran += 1
            return total

        self.definition = env.workflow(flow)
        self.n = n

    def start(self, wid: str = "st-1") -> str:
        eid, _ = self.env.engine.start(self.definition, (self.n,), {}, workflow_id=wid)
        return eid


def sticky(env: InProcess) -> StickyCache:
    return env.engine.driver.sticky


def suspended_at_step_two() -> tuple[InProcess, Flow, str]:
    env = InProcess()
    flow = Flow(env)
    eid = flow.start()
    env.dispatcher.run_some(2)  # the first drive, then activity 1 (its inline drive takes step 2)
    assert [d["id"] for d in env.store.query_partition(eid).docs if d["id"].startswith("s:")] == [
        "s:000001",
        "s:000002",
    ]
    return env, flow, eid


def test_a_suspended_workflow_is_resumed_with_the_new_outcome_only() -> None:
    env = InProcess()
    flow = Flow(env, n=6)
    eid = flow.start()
    env.run()
    assert env.ex(eid)["result"] == sum(range(6))
    assert flow.starts == 1  # never replayed from the top
    assert sticky(env).stats["hit"] == 6 and sticky(env).stats["miss"] == 1
    assert flow.finally_ran == 1
    assert eid not in sticky(env).held()  # a finished workflow leaves the cache


def test_without_the_cache_every_drive_replays_from_the_top() -> None:
    env = InProcess()
    sticky(env).size = 0
    flow = Flow(env, n=6)
    eid = flow.start()
    env.run()
    assert env.ex(eid)["result"] == sum(range(6))
    assert flow.starts == 7 and flow.finally_ran == 7


def _history(env: InProcess, eid: str) -> dict[str, Doc]:
    return {d["id"]: d for d in env.store.query_partition(eid).docs}


def _with_outcome(env: InProcess, eid: str, seq: int, value: Any) -> dict[str, Doc]:
    docs = _history(env, eid)
    rid = f"r:{seq:06d}"
    docs[rid] = {"pk": eid, "id": rid, "type": "result", "run": 0, "seq": seq, "ok": True, "value": value}
    return docs


def _decide(env: InProcess, flow: Flow, docs: dict[str, Doc], cache: StickyCache | None) -> Replay:
    eng = env.engine
    return replay(docs["exec"], docs, flow.definition, eng.registry, env.clock.now(), eng.settings, sticky=cache)


def _same(a: Replay, b: Replay) -> None:
    def error(r: Replay) -> dict[str, Any] | None:  # its traceback names the frames that ran it
        return None if r.error is None else {k: v for k, v in r.error.items() if k != "traceback"}

    assert (a.kind, a.value, error(a), a.steps) == (b.kind, b.value, error(b), b.steps)
    assert a.new_docs == b.new_docs
    assert [asdict(s) for s in a.sends] == [asdict(s) for s in b.sends]  # type: ignore[call-overload]


def test_a_resumed_instance_decides_what_a_full_replay_decides() -> None:
    env, flow, eid = suspended_at_step_two()
    docs = _with_outcome(env, eid, 2, 1)
    full = _decide(env, flow, docs, None)
    resumed = _decide(env, flow, docs, sticky(env))
    assert sticky(env).stats["hit"] == 2
    _same(resumed, full)
    assert resumed.kind == "suspended" and [d["id"] for d in resumed.new_docs] == ["s:000003"]


@pytest.mark.parametrize(
    "change, reason",
    [
        ("changed", "changed"),  # a document it was fed now says something else
        ("deleted", "deleted"),  # ... or is gone
        ("generation", "exec"),  # retry / reset / resume rewrote the history
        ("cancel", "exec"),  # a cancel request: the context reads it when it is made
        ("signal", "new-document"),  # a signal value: a full replay decides the waits
    ],
)
def test_anything_else_changed_falls_back_to_a_full_replay(change: str, reason: str) -> None:
    env, flow, eid = suspended_at_step_two()
    docs = _with_outcome(env, eid, 2, 1)
    if change == "changed":
        docs["r:000001"] = docs["r:000001"] | {"value": 100}
    elif change == "deleted":
        del docs["r:000001"]
    elif change == "generation":
        docs["exec"] = docs["exec"] | {"generation": 1}
    elif change == "cancel":
        docs["exec"] = docs["exec"] | {"cancel_requested": True}
    else:
        docs["sgv:000001"] = {"pk": eid, "id": "sgv:000001", "type": "signal_value", "name": "x", "n": 1}
    full = _decide(env, flow, docs, None)
    fell_back = _decide(env, flow, docs, sticky(env))
    assert sticky(env).stats[f"fallback:{reason}"] == 1
    _same(fell_back, full)
    # the reference replay unwinds at its suspension; the old instance was unwound; the new one
    # ran its finally only if it ended
    assert flow.finally_ran == 2 + (fell_back.kind != "suspended")


def test_a_marker_rewritten_by_an_attempt_lease_is_not_a_change() -> None:
    env, flow, eid = suspended_at_step_two()
    docs = _with_outcome(env, eid, 2, 1)
    docs["s:000002"] = docs["s:000002"] | {"lease": {"holder": "w", "expires": 1.0}, "attempts": 1, "_etag": "x"}
    _decide(env, flow, docs, sticky(env))
    assert sticky(env).stats["hit"] == 2 and flow.starts == 1


def test_a_failed_commit_drops_the_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    env, flow, eid = suspended_at_step_two()
    real = env.store.batch
    failed: list[str] = []

    def batch(pk: str, ops: Any) -> Any:
        if not failed:
            failed.append(pk)
            raise ConflictError("injected")
        return real(pk, ops)

    monkeypatch.setattr(env.store, "batch", batch)
    env.run()
    assert failed and env.ex(eid)["result"] == sum(range(4))
    # the drive whose commit failed resumed the instance; the retry replayed from the top
    assert flow.starts == 2


def test_an_uncommitted_replay_is_never_resumed() -> None:
    env, flow, eid = suspended_at_step_two()
    docs = _with_outcome(env, eid, 2, 1)
    _decide(env, flow, docs, sticky(env))  # decided step 3, never committed
    docs3 = _with_outcome(env, eid, 2, 1)
    again = _decide(env, flow, docs3, sticky(env))
    assert sticky(env).stats["fallback:uncommitted"] == 1
    _same(again, _decide(env, flow, docs3, None))


def test_eviction_unwinds_the_instance_and_its_finally_runs() -> None:
    env = InProcess()
    sticky(env).size = 1
    flow = Flow(env)
    first = flow.start("st-a")
    env.dispatcher.run_some(1)  # first is suspended at step 1, alive
    assert sticky(env).held() == [first] and flow.finally_ran == 0
    second = flow.start("st-b")
    env.dispatcher.run_some(2)  # its drive evicts the first instance
    assert first not in sticky(env).held()
    assert flow.finally_ran == 1 and sticky(env).stats["evicted"] >= 1
    env.run()
    assert env.ex(first)["result"] == env.ex(second)["result"] == sum(range(4))


def test_a_drive_in_another_thread_replays_and_the_old_instance_is_not_resumed() -> None:
    env, flow, eid = suspended_at_step_two()
    other = threading.Thread(target=env.dispatcher.run_some, args=(1,))  # activity 2 + its drive
    other.start()
    other.join()
    assert flow.starts == 2  # no live instance in that thread: a full replay
    assert eid in sticky(env).held()  # the main thread's is still there, now stale
    env.run()
    assert sticky(env).stats["fallback:new-document"] == 1  # step 3 was taken elsewhere
    assert env.ex(eid)["result"] == sum(range(4))


def test_queries_never_use_the_cache() -> None:
    env, flow, eid = suspended_at_step_two()
    before = dict(sticky(env).stats)
    docs = _history(env, eid)
    eng = env.engine
    read = replay(
        docs["exec"], docs, flow.definition, eng.registry, 0.0, eng.settings, read_only=True, sticky=sticky(env)
    )
    assert read.context is not None and dict(sticky(env).stats) == before


# --- property: every drive decides what a full replay over its history decides ----------------


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("act"), st.integers(0, 3)),
        st.tuples(st.just("gather"), st.integers(1, 3)),
        st.tuples(st.just("now"), st.just(0)),
        st.tuples(st.just("sleep"), st.integers(1, 5)),
        st.tuples(st.just("done"), st.just(0)),
        st.tuples(st.just("local"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=8,
)


def _program(env: InProcess, ops: list[tuple[str, int]]) -> Any:
    add = env.registry.add_activity("p.add", lambda a, b: a + b)
    loc = env.registry.add_activity("p.loc", lambda a: a * 2, {"local": True})

    def prog() -> list[Any]:
        ctx = require_context("prog")
        out: list[Any] = []
        for op, k in ops:
            if op == "act":
                out.append(ctx.call_activity(add.name, add.codec, (k, len(out)), {}).result())
            elif op == "gather":
                out.append(wf.gather([ctx.call_activity(add.name, add.codec, (i, k), {}) for i in range(k)]))
            elif op == "now":
                out.append(wf.now().timestamp())
            elif op == "sleep":
                wf.sleep(float(k))
            elif op == "done":
                fut = ctx.call_activity(add.name, add.codec, (1, 1), {})
                out.append(fut.done())
                out.append(fut.result())
            else:
                out.append(ctx.call_activity(loc.name, loc.codec, (k,), {}).result())
        return out

    return env.workflow(prog)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_every_drive_decides_what_a_full_replay_decides(ops: list[tuple[str, int]], seed: int) -> None:
    import random

    env = InProcess(step_time=1.0)
    definition = _program(env, ops)
    compared: list[str] = []
    real = Driver.replay

    def checked(self: Driver, ex: Doc, history: dict[str, Doc], now: float) -> Replay:
        frozen = {k: strip_reserved(v) for k, v in history.items()}
        full = replay(ex, history, definition, env.engine.registry, now, env.engine.settings)
        got = real(self, ex, history, now)
        _same(got, full)
        assert {k: strip_reserved(v) for k, v in history.items()} == frozen
        compared.append(got.kind)
        return got

    rng = random.Random(seed)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Driver, "replay", checked)
        eid, _ = env.engine.start(definition, (), {})
        for _ in range(500):
            if rng.random() < 0.2 and env.engine.driver.sticky.held():
                env.engine.driver.sticky.drop(rng.choice(env.engine.driver.sticky.held()))
            env.clock.advance(rng.uniform(0, 3))
            if not env.dispatcher.run_some(1):
                if env.ex(eid)["status"] != "running":
                    break
                env.clock.advance(10)
                env.engine.timers.fire_due_clocks()
    assert env.ex(eid)["status"] == "completed", env.ex(eid)
    assert compared and compared[-1] == "completed"


# --- decoded results: a full replay does not decode a stored result again ----------------------


def test_a_full_replay_takes_immutable_results_decoded_before(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_durable.codecs import ValueCodec

    env = InProcess()
    sticky(env).size = 0  # every drive replays from the top
    flow = Flow(env, n=6)
    calls: list[Any] = []
    real = ValueCodec.decode

    def counting(self: ValueCodec, data: Any, what: str = "value") -> Any:
        if what.startswith("activity 'sticky.add'"):  # a step's result handed to the workflow
            calls.append(data)
        return real(self, data, what)

    monkeypatch.setattr(ValueCodec, "decode", counting)
    eid = flow.start()
    env.run()
    assert env.ex(eid)["result"] == sum(range(6)) and flow.starts == 7
    # each result decoded when its drive carries it in (not stored yet) and once stored, not
    # once per later replay (1 + 2 + ... + 6 = 21 without the cache)
    assert len(calls) <= 2 * 6


def test_decoded_results_of_another_store_with_the_same_ids_are_not_taken() -> None:
    from celery_durable.codecs import ValueCodec
    from celery_durable.engine.replay.decoded import decoded

    codec = ValueCodec(int)
    doc = {"id": "r:000001", "_etag": "1", "value": 2}
    assert decoded("same-id", 0, 1, doc, codec, "x") == 2
    assert decoded("same-id", 0, 1, doc, codec, "x") == 2  # taken from the cache
    # another store (or a purged and re-created id) repeats the etag with another value
    assert decoded("same-id", 0, 1, doc | {"value": 5}, codec, "x") == 5
    assert decoded("same-id", 0, 1, doc | {"value": 2.0}, ValueCodec(float), "x") == 2.0


def test_a_durable_call_in_finally_while_unwinding_does_not_park_again() -> None:
    env = InProcess()
    act = env.registry.add_activity("sticky.one", lambda: 1)
    seen: list[str] = []

    def flow() -> int:
        ctx = require_context("a")
        try:
            return int(ctx.call_activity(act.name, act.codec, (), {}).result())
        finally:
            try:
                ctx.call_activity(act.name, act.codec, (), {}).result()  # no outcome: would suspend
            except BaseException as exc:  # noqa: BLE001 - what the unwinding raises here
                seen.append(type(exc).__name__)
                raise

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="fin-1")
    env.dispatcher.run_some(1)
    assert eid in sticky(env).held()
    sticky(env).drop(eid)  # evicted: unwound with Suspend, its finally's durable call raises too
    assert seen == ["Suspend"] and eid not in sticky(env).held()
