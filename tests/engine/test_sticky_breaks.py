"""Adversarial review of sticky workflow instances (engine/replay/sticky.py, issue 15).

The promise: whatever the cache does, a drive decides exactly what a full replay over the same
history decides (same new documents, sends, status, result). Each test drives a workflow with
the cache on and compares every drive against a full replay of the same history.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_durable import workflow as wf
from celery_durable.engine.drive.driver import Driver
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.replay.history import Replay, replay
from celery_durable.stores.base import Doc
from tests.engine.inprocess import FakeClock, InProcess


def _clock(env: InProcess) -> FakeClock:
    assert isinstance(env.clock, FakeClock)
    return env.clock


def _decision(r: Replay) -> tuple[Any, ...]:
    error = None if r.error is None else {k: v for k, v in r.error.items() if k != "traceback"}
    sends = [asdict(s) for s in r.sends]  # type: ignore[call-overload]
    return (r.kind, r.value, error, r.steps, r.new_docs, sends, r.status_set, r.custom_status, r.search_updates)


def drive_compared(env: InProcess, definition: Any, eid: str, steps: int = 200) -> list[str]:
    """Run ``env`` to the end, checking every drive against a full replay of its history."""
    real = Driver.replay
    kinds: list[str] = []

    def checked(self: Driver, ex: Doc, history: dict[str, Doc], now: float) -> Replay:
        full = replay(ex, history, definition, env.engine.registry, now, env.engine.settings)
        got = real(self, ex, history, now)
        assert _decision(got) == _decision(full)
        kinds.append(got.kind)
        return got

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Driver, "replay", checked)
        for _ in range(steps):
            if not env.dispatcher.run_some(1):
                if env.ex(eid)["status"] != "running":
                    break
                _clock(env).advance(100)
                env.engine.timers.fire_due_clocks()
    return kinds


def test_a_durable_call_in_finally_decides_the_same_as_a_full_replay() -> None:
    """A drive suspending inside ``try`` runs its ``finally`` in a full replay (the function is
    unwound) but not in a parked instance: a step taken there was recorded and sent by the full
    replay only (a compensation run while the body still waits), so the two disagreed."""
    env = InProcess()
    act = env.registry.add_activity("adv.add", lambda a, b: a + b)

    def flow() -> int:
        ctx = require_context("flow")
        f1 = ctx.call_activity(act.name, act.codec, (1, 1), {})
        f2 = ctx.call_activity(act.name, act.codec, (2, 2), {})
        try:
            f1.result()
        finally:
            ctx.call_activity(act.name, act.codec, (3, 3), {}).result()  # clean-up step
        return int(f2.result())

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="adv-fin")
    kinds = drive_compared(env, definition, eid)
    assert kinds[-1] == "completed" and env.ex(eid)["result"] == 4


def test_set_status_in_finally_decides_the_same_as_a_full_replay() -> None:
    env = InProcess()
    act = env.registry.add_activity("adv.one", lambda: 1)

    def flow() -> int:
        ctx = require_context("flow")
        try:
            wf.set_status("working")
            return int(ctx.call_activity(act.name, act.codec, (), {}).result())
        finally:
            wf.set_status("done")

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="adv-status")
    kinds = drive_compared(env, definition, eid)
    assert kinds[-1] == "completed" and env.ex(eid)["custom_status"] == "done"


def test_a_swallowed_suspension_decides_the_same_as_a_full_replay() -> None:
    """``except BaseException`` around a suspension point: a full replay went on past it (and
    completed the workflow before its step had an outcome); a parked instance waits."""
    env = InProcess()
    act = env.registry.add_activity("adv.two", lambda: 2)

    def flow() -> int:
        ctx = require_context("flow")
        try:
            return int(ctx.call_activity(act.name, act.codec, (), {}).result())
        except BaseException:  # noqa: BLE001 - the abuse under test
            return -1

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="adv-swallow")
    kinds = drive_compared(env, definition, eid)
    assert kinds[-1] == "completed" and env.ex(eid)["result"] == 2


# --- property: a wider workflow generator, outcomes in random order, signals between drives -----

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("act"), st.integers(0, 3)),
        st.tuples(st.just("gather"), st.integers(1, 3)),
        st.tuples(st.just("done_loop"), st.integers(1, 2)),
        st.tuples(st.just("finally"), st.integers(0, 2)),
        st.tuples(st.just("swallow"), st.integers(0, 2)),
        st.tuples(st.just("status"), st.integers(0, 2)),
        st.tuples(st.just("patched"), st.integers(0, 1)),
        st.tuples(st.just("signal"), st.integers(0, 3)),
        st.tuples(st.just("child"), st.integers(0, 2)),
        st.tuples(st.just("children"), st.integers(2, 3)),
        st.tuples(st.just("mutate"), st.integers(0, 2)),
        st.tuples(st.just("random"), st.integers(0, 1)),
        st.tuples(st.just("local"), st.integers(0, 2)),
        st.tuples(st.just("sleep"), st.integers(1, 4)),
        st.tuples(st.just("catch"), st.integers(0, 1)),
        st.tuples(st.just("send"), st.integers(0, 1)),
        st.tuples(st.just("search"), st.integers(0, 2)),
        st.tuples(st.just("race"), st.integers(1, 3)),
        st.tuples(st.just("again"), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=7,
)


def _wide_program(env: InProcess, ops: list[tuple[str, int]]) -> Any:
    add = env.registry.add_activity("w.add", lambda a, b: a + b)
    lst = env.registry.add_activity("w.list", lambda n: list(range(n)))
    loc = env.registry.add_activity("w.loc", lambda a: a * 2, {"local": True})

    def boom(a: int) -> int:
        raise ValueError(f"boom {a}")

    bad = env.registry.add_activity("w.boom", boom, {"retry_policy": {"maximum_attempts": 1}})

    def kid(k: int) -> int:
        ctx = require_context("kid")
        return int(ctx.call_activity(add.name, add.codec, (k, 100), {}).result())

    kid_def = env.workflow(kid)

    def prog(n: int = 0) -> list[Any]:
        ctx = require_context("prog")
        out: list[Any] = []

        def a(x: int, y: int) -> Any:
            return ctx.call_activity(add.name, add.codec, (x, y), {})

        for op, k in ops:
            if op == "act":
                out.append(a(k, len(out)).result())
            elif op == "gather":
                out.append(wf.gather([a(i, k) for i in range(k)]))
            elif op == "done_loop":
                fut = a(k, 1)
                while not fut.done():
                    wf.sleep(1.0)
                out.append(fut.result())
            elif op == "finally":
                f1, f2 = a(k, 1), a(k, 2)
                try:
                    out.append(f1.result())
                finally:
                    out.append(a(k, 3).result())
                    wf.set_status({"fin": k})
                out.append(f2.result())
            elif op == "swallow":
                try:
                    out.append(a(k, 4).result())
                except BaseException:  # noqa: BLE001 - abuse: a full replay goes on here
                    out.append("swallowed")
            elif op == "status":
                wf.set_status(["s", k, len(out)])
            elif op == "patched":
                out.append(wf.patched(f"p{k}"))
            elif op == "signal":
                try:
                    out.append(wf.wait_signal("go", timeout=float(k + 1)))
                except Exception as exc:  # noqa: BLE001 - a timeout is an outcome too
                    out.append(type(exc).__name__)
            elif op == "child":
                out.append(ctx.start_child(kid_def, (k,), {}, None).result())
            elif op == "children":
                futs = [ctx.start_child(kid_def, (i,), {}, None) for i in range(k)]
                out.append([f.result() for f in reversed(futs)])
            elif op == "mutate":
                got = ctx.call_activity(lst.name, lst.codec, (k + 1,), {}).result()
                got.append("mine")  # kept across the next suspension; a replay recomputes it
                out.append(a(k, 5).result())
                out.append(list(got))
            elif op == "random":
                out.append([wf.random().randint(0, 1000), str(wf.uuid4()), wf.now().timestamp()])
            elif op == "local":
                out.append(ctx.call_activity(loc.name, loc.codec, (k,), {}).result())
            elif op == "sleep":
                wf.sleep(float(k))
                out.append(wf.now().timestamp())
            elif op == "send":
                try:
                    wf.signal_external("wide" if k else "nobody", "go", len(out))
                    out.append("sent")
                except Exception as exc:  # noqa: BLE001 - no such target: the step's failure
                    out.append(type(exc).__name__)
            elif op == "search":
                wf.upsert_search(tag=f"t{k}-{len(out)}")
            elif op == "race":
                timer, fut = wf.start_timer(float(k)), a(k, 6)
                while not timer.done() and not fut.done():
                    wf.sleep(0.5)
                out.append(fut.result())
            elif op == "again":
                if n < 1:
                    wf.continue_as_new(n + 1)
                out.append(("run", n))
            else:  # catch a step's failure around a suspension, then go on
                try:
                    ctx.call_activity(bad.name, bad.codec, (k,), {}).result()
                except Exception as exc:  # noqa: BLE001
                    out.append(type(exc).__name__)
        return out

    return env.registry.add_workflow("prog", prog, {"go": Any})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_every_drive_of_wide_workflows_decides_what_a_full_replay_decides(
    ops: list[tuple[str, int]], seed: int
) -> None:
    env = InProcess(step_time=1.0)
    definition = _wide_program(env, ops)
    real = Driver.replay
    compared: list[str] = []
    mismatches: list[Any] = []

    minted = [0]

    def fake_uuid4() -> uuid.UUID:  # new random values: the same in both replays of one drive
        minted[0] += 1
        return uuid.UUID(int=minted[0] * 7919)

    def checked(self: Driver, ex: Doc, history: dict[str, Doc], now: float) -> Replay:
        wfdef = env.engine.registry.workflow(str(ex.get("workflow")))
        start = minted[0]
        full = replay(ex, history, wfdef, env.engine.registry, now, env.engine.settings)
        minted[0] = start
        got = real(self, ex, history, now)
        if _decision(got) != _decision(full):  # raised in a thread or a clock firing: kept here too
            mismatches.append((ex["pk"], _decision(got), _decision(full)))
        assert _decision(got) == _decision(full), (ex["pk"], ops)
        compared.append(got.kind)
        return got

    rng = random.Random(seed)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Driver, "replay", checked)
        m.setattr(uuid, "uuid4", fake_uuid4)
        eid, _ = env.engine.start(definition, (), {}, workflow_id="wide")
        for _ in range(800):
            sticky = env.engine.driver.sticky
            if rng.random() < 0.1 and sticky.held():
                sticky.drop(rng.choice(sticky.held()))
            if rng.random() < 0.15:
                env.engine.signal(eid, "go", rng.randint(0, 9))
            q = env.dispatcher.queue
            if len(q) > 1:
                q.rotate(-rng.randrange(len(q)))  # outcomes land in any order
            if rng.random() < 0.01:
                env.engine.cancel(eid)  # lands with whatever outcome comes next
            _clock(env).advance(rng.uniform(0, 2))
            if rng.random() < 0.1:  # another thread of the process drives (its own live instances)
                other = threading.Thread(target=env.dispatcher.run_some, args=(1,))
                other.start()
                other.join()
                continue
            if not env.dispatcher.run_some(1):
                if env.ex(eid)["status"] != "running":
                    break
                _clock(env).advance(10)
                env.engine.timers.fire_due_clocks()
    assert not mismatches, mismatches[0]
    assert env.ex(eid)["status"] in ("completed", "failed", "cancelled"), env.ex(eid)
    assert compared
    HITS.update(env.engine.driver.sticky.stats)


HITS: Counter[str] = Counter()


def test_a_keyboard_interrupt_while_unwinding_an_instance_is_not_swallowed() -> None:
    """An interrupt (Ctrl-C, a worker's shutdown) raised while an evicted instance unwinds
    propagates as it does from a full replay's unwinding; it was logged at debug and lost."""
    env = InProcess()
    act = env.registry.add_activity("adv.three", lambda: 3)

    def flow() -> int:
        ctx = require_context("flow")
        try:
            return int(ctx.call_activity(act.name, act.codec, (), {}).result())
        finally:
            raise KeyboardInterrupt  # arrives while the evicted instance unwinds (it parked before)

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="adv-kbi")
    env.dispatcher.run_some(1)
    assert eid in env.engine.driver.sticky.held()
    with pytest.raises(KeyboardInterrupt):
        env.engine.driver.sticky.drop(eid)
    assert eid not in env.engine.driver.sticky.held()


class Tag(str):
    """A str subclass a codec can decode to: its instances carry attributes (they are mutable)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())


def test_a_decoded_result_of_a_str_subclass_is_not_shared_between_replays() -> None:
    """engine/replay/decoded.py handed the same decoded object to every full replay when it was an
    instance of an immutable *base* type (``isinstance(v, str)``): a subclass instance carries
    attributes, so what one replay set on it the next one read (no longer a fresh copy)."""
    env = InProcess()
    env.engine.driver.sticky.size = 0  # every drive a full replay: the decoded cache is used

    def tag() -> Tag:
        return Tag("t")

    t_act = env.registry.add_activity("adv.tag", tag)
    add = env.registry.add_activity("adv.add2", lambda a, b: a + b)

    def flow() -> int:
        ctx = require_context("flow")
        t = ctx.call_activity(t_act.name, t_act.codec, (), {}).result()
        seen = int(getattr(t, "seen", 0))
        t.seen = seen + 1  # workflow code may change its own copy
        ctx.call_activity(add.name, add.codec, (1, 1), {}).result()
        ctx.call_activity(add.name, add.codec, (2, 2), {}).result()
        return seen

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {}, workflow_id="adv-tag")
    env.run()
    assert env.ex(eid)["status"] == "completed"
    assert env.ex(eid)["result"] == 0
