"""Regression tests for replay bugs of issue 10 (§2: 1, 2, 4, 9, and sends of failed/continued replays).

Adapted from the reproducers in ``shared/repro/core``; each failed on the code before its fix.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celery_durable import workflow as wf
from celery_durable.codecs import CallCodec, codec_for
from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.registry import WorkflowDef
from celery_durable.engine.replay.context import DurableFuture, require_context
from celery_durable.stores.memory import MemoryStore


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class Env:
    """One in-process worker over an in-memory store, with a settable clock."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.clock = FakeClock()
        self.dispatcher = InlineDispatcher()
        self.registry = Registry()
        self.engine = Engine(self.store, self.dispatcher, self.registry, clock=self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher)

    def activity(self, fn: Callable[..., Any]) -> Any:
        act = self.registry.add_activity(fn.__name__, fn)

        def start(*args: Any, **kwargs: Any) -> DurableFuture[Any]:
            return require_context("activity").call_activity(act.name, act.codec, args, kwargs)

        def call(*args: Any, **kwargs: Any) -> Any:
            return start(*args, **kwargs).result()

        call.start = start  # type: ignore[attr-defined]
        call.s = lambda *a, **k: type("Sig", (), {"task": act.name, "args": a, "kwargs": k})()  # type: ignore[attr-defined]
        return call

    def workflow(self, fn: Callable[..., Any]) -> WorkflowDef:
        return self.registry.add_workflow(fn.__name__, fn)

    def start(self, definition: WorkflowDef, *args: Any, wid: str | None = None, **kwargs: Any) -> str:
        eid, _ = self.engine.start(definition, args, kwargs, workflow_id=wid)
        return eid

    def run(self, fn: Callable[..., Any], *args: Any, wid: str | None = None, **kwargs: Any) -> dict[str, Any]:
        eid = self.start(self.workflow(fn), *args, wid=wid, **kwargs)
        self.worker.run()
        return self.engine.read_exec(eid)

    def recover(self, times: int = 3) -> None:
        """What beat does later: scans with the clock far past every deadline."""
        for _ in range(times):
            self.clock.t += 10_000
            self.engine.recovery.scan()
            self.engine.timers.fire_due_clocks()
            self.worker.run()


@pytest.fixture
def env() -> Env:
    return Env()


# --- bug 1: keyword arguments shifted into defaulted parameters ------------------------------


def charge(order_id: str, cents: int, currency: str = "USD", idempotency_key: str | None = None) -> str:
    return f"{order_id} {cents} {currency} key={idempotency_key}"


def test_keyword_after_a_skipped_default_keeps_its_name() -> None:
    codec = codec_for(charge)
    enc = codec.encode_args(("o-1", 100), {"idempotency_key": "k-42"})
    args, kwargs = codec.decode_args(json.loads(json.dumps(enc)))
    assert charge(*args, **kwargs) == charge("o-1", 100, idempotency_key="k-42") == "o-1 100 USD key=k-42"
    assert enc == {"args": ["o-1", 100], "kwargs": {"idempotency_key": "k-42"}}


def test_keyword_only_parameters_stay_keywords() -> None:
    def f(a: int, b: int = 1, *args: int, k: int, m: int = 3, **extra: int) -> None: ...

    codec = CallCodec(f)
    assert codec.encode_args((1, 2, 3), {"k": 4, "z": 5}) == {"args": [1, 2, 3], "kwargs": {"k": 4, "z": 5}}
    assert codec.encode_args((1,), {"k": 4}) == {"args": [1], "kwargs": {"k": 4}}


def test_stored_payloads_of_the_old_shape_still_decode() -> None:
    codec = codec_for(charge)
    assert codec.decode_args({"args": ["o-1", 100, "EUR"], "kwargs": {"idempotency_key": "k"}}) == (
        ("o-1", 100, "EUR"),
        {"idempotency_key": "k"},
    )
    assert codec.decode_args({"args": ["o-1"], "kwargs": {}}) == (("o-1",), {})


def test_keyword_arguments_bind_end_to_end(env: Env) -> None:
    @env.activity
    def pay(order_id: str, cents: int, currency: str = "USD", idempotency_key: str | None = None) -> str:
        return f"{order_id} {cents} {currency} key={idempotency_key}"

    def order(order_id: str, coupon: str = "", note: str = "") -> str:
        return pay(order_id, 100, idempotency_key=f"{order_id}:{note}") + f" | coupon={coupon!r} note={note!r}"

    ex = env.run(order, "o-1", note="gift")
    assert ex["status"] == "completed", ex
    assert ex["result"] == "o-1 100 USD key=o-1:gift | coupon='' note='gift'"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1) | st.text(max_size=4),  # JSON-exact ints
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _signature_and_call(draw: st.DrawFn) -> tuple[inspect.Signature, tuple[Any, ...], dict[str, Any]]:
    P = inspect.Parameter
    n_posonly, n_pos = draw(st.integers(0, 2)), draw(st.integers(0, 3))
    positional = [P(f"p{i}", P.POSITIONAL_ONLY) for i in range(n_posonly)]
    positional += [P(f"a{i}", P.POSITIONAL_OR_KEYWORD) for i in range(n_pos)]
    n_default = draw(st.integers(0, len(positional)))  # defaults are a suffix of the positional params
    for i in range(len(positional) - n_default, len(positional)):
        positional[i] = positional[i].replace(default=draw(_json_values))
    params = list(positional)
    if draw(st.booleans()):
        params.append(P("args", P.VAR_POSITIONAL))
    for i in range(draw(st.integers(0, 2))):
        default = draw(_json_values) if draw(st.booleans()) else P.empty
        params.append(P(f"k{i}", P.KEYWORD_ONLY, default=default))
    var_kw = draw(st.booleans())
    if var_kw:
        params.append(P("kw", P.VAR_KEYWORD))
    sig = inspect.Signature(params)
    # a call: some positional values, then any remaining parameter by keyword (or left to its default)
    n_args = draw(st.integers(0, len(positional) + (2 if any(p.kind is P.VAR_POSITIONAL for p in params) else 0)))
    args = tuple(draw(_json_values) for _ in range(n_args))
    kwargs: dict[str, Any] = {}
    for p in params[n_args:] if n_args <= len(positional) else params[len(positional) :]:
        if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) and (p.default is P.empty or draw(st.booleans())):
            kwargs[p.name] = draw(_json_values)
    if var_kw:
        for name in draw(st.lists(st.sampled_from(["x", "y", "p0", "p1"]), max_size=2, unique=True)):
            kwargs.setdefault(name, draw(_json_values))
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        assume(False)
    return sig, args, kwargs


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_signature_and_call())
def test_payload_decodes_to_the_binding_of_the_direct_call(
    case: tuple[inspect.Signature, tuple[Any, ...], dict[str, Any]],
) -> None:
    sig, args, kwargs = case

    def fn(*a: Any, **k: Any) -> None: ...

    fn.__signature__ = sig  # type: ignore[attr-defined]
    codec = CallCodec(fn)
    enc = codec.encode_args(args, kwargs)
    stored = json.loads(json.dumps(enc))  # JSON only in the store and on the wire
    assert set(stored) == {"args", "kwargs"}
    dargs, dkwargs = codec.decode_args(stored)
    assert sig.bind(*dargs, **dkwargs).arguments == sig.bind(*args, **kwargs).arguments
    for name, p in sig.parameters.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name in kwargs:
            assert name in stored["kwargs"]


# --- bug 2: workflow code mutating recorded values in place ------------------------------------


@pytest.mark.parametrize("hint", [Any, dict, dict[str, Any]], ids=["Any", "dict", "dict[str,Any]"])
def test_mutating_an_activity_result_changes_neither_history_nor_replays(env: Env, hint: Any) -> None:
    def fetch() -> Any:
        return {"items": [1, 2]}

    fetch.__annotations__["return"] = hint
    fetch_ = env.activity(fetch)

    @env.activity
    def step_b() -> int:
        return 0

    def flow() -> Any:
        d = fetch_()
        d["items"].append(3)  # a local change of a local value
        step_b()
        return d

    ex = env.run(flow)
    assert ex["result"] == {"items": [1, 2, 3]}
    assert env.store.read(ex["pk"], "r:000001")["value"] == {"items": [1, 2]}


def test_mutating_workflow_arguments_does_not_rewrite_the_payload(env: Env) -> None:
    @env.activity
    def step(i: int) -> int:
        return i

    def flow(cart, *, tags=None):  # type: ignore[no-untyped-def]
        cart.append("gift-wrap")
        tags.append("x")
        step(1)
        step(2)
        return cart + tags

    ex = env.run(flow, ["book"], tags=["t"])
    assert ex["result"] == ["book", "gift-wrap", "t", "x"]
    assert ex["payload"] == {"args": [["book"]], "kwargs": {"tags": ["t"]}}


def test_mutating_child_results_signals_and_side_effects_changes_nothing(env: Env) -> None:
    @env.activity
    def step(i: int) -> int:
        return i

    def child() -> list[int]:
        return [1]

    child_def = env.workflow(child)

    def flow() -> list[Any]:
        ctx = require_context("test")
        c = ctx.start_child(child_def, (), {}, None).result()
        c.append(2)
        s = wf.wait_signal("go")
        s["seen"] = True
        e = ctx.side_effect("uuid", lambda: {"n": [1]})
        e["n"].append(2)
        step(1)
        step(2)
        return [c, s, e]

    eid = env.start(env.workflow(flow))
    env.worker.run()
    env.engine.signal(eid, "go", {"v": 1})
    env.worker.run()
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "completed", ex
    assert ex["result"] == [[1, 2], {"v": 1, "seen": True}, {"n": [1, 2]}]
    docs = {d["id"]: d for d in env.store.query_partition(eid).docs}
    assert docs["r:000001"]["value"] == [1]
    assert [d["value"] for d in docs.values() if d.get("type") == "signal"] == [{"v": 1}]
    assert docs["s:000003"]["value"] == {"n": [1]}


def test_activity_messages_do_not_alias_the_recorded_marker(env: Env) -> None:
    @env.activity
    def keep(items: list[Any]) -> int:
        return len(items)

    def flow() -> int:
        return keep([["a"]])

    eid = env.start(env.workflow(flow))
    replay = env.engine.driver.replay(env.engine.read_exec(eid), env.engine.cache.load(eid), env.clock.now())
    (req,) = replay.sends
    assert isinstance(req, ActivityRequest)
    req.args[0][0].append("changed in flight")  # e.g. an in-process transport handing the message on
    (marker,) = replay.new_docs
    assert marker["input"] == {"args": [[["a"]]], "kwargs": {}}


# --- bug 9: DurableFuture.done() answered from the whole history ------------------------------


def test_future_done_is_replayed_as_recorded(env: Env) -> None:
    @env.activity
    def slow() -> str:
        return "slow"

    @env.activity
    def fast() -> str:
        return "fast"

    @env.activity
    def fallback() -> str:
        return "fallback"

    def flow() -> str:
        f = slow.start()  # step 1
        fast()  # step 2
        if f.done():  # step 3: answered once, replayed as recorded
            return str(f.result())
        return fallback() + "+" + f.result()

    eid = env.start(env.workflow(flow), wid="F")
    env.dispatcher.run_some(1)  # the first drive sends slow and fast
    held = [(k, r) for k, r in env.dispatcher.queue if k == "activity" and r.name == "slow"]
    for item in held:
        env.dispatcher.queue.remove(item)
    env.worker.run()  # fast lands first: done() answers False, fallback is scheduled
    env.dispatcher.queue.extend(held)
    env.worker.run()  # slow lands: a replay must take the same branch
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "completed", ex
    assert ex["result"] == "fallback+slow"
    marker = env.store.read(eid, "s:000003")
    assert (marker["kind"], marker["value"]) == ("done", False)


def test_done_answers_true_once_finished_and_gather_and_repr_record_nothing(env: Env) -> None:
    @env.activity
    def ident(x: int) -> int:
        return x

    def flow() -> list[Any]:
        f = ident.start(1)
        f.result()
        repr(f)
        out = wf.gather(ident.s(i) for i in range(3))
        return [f.done(), out]

    ex = env.run(flow)
    assert ex["result"] == [True, [0, 1, 2]]
    assert ex["steps"] == 5  # 1 + 3 gathered + the done() answer


# --- bug 4: child ids collide across continue-as-new runs -------------------------------------


def test_child_ids_are_unique_across_continue_as_new(env: Env) -> None:
    child_runs: list[str] = []

    @env.activity
    def step(i: int) -> int:
        return i

    def child(tag: str) -> str:
        child_runs.append(tag)
        return f"child:{tag}"

    child_def = env.workflow(child)

    def parent(n: int) -> str:
        ctx = require_context("test")
        if n == 0:
            for i in range(10):
                step(i)  # steps 1..10
            ctx.start_child(child_def, ("run0",), {}, None).result()  # run 0, step 11
            wf.continue_as_new(1)
        return str(ctx.start_child(child_def, ("run1",), {}, None).result())  # run 1, step 1

    eid = env.start(env.workflow(parent), 0, wid="P")
    env.worker.run()
    env.recover()
    ex = env.engine.read_exec(eid)
    assert (ex["status"], ex["run"], ex["result"]) == ("completed", 1, "child:run1")
    assert sorted(set(child_runs)) == ["run0", "run1"]
    assert sorted(env.store.scan_partitions("P-")) == ["P-c1.r1", "P-c11"]  # run-0 ids are kept as they were


# --- sends of a replay that ends failed or continued ------------------------------------------


def test_a_failing_replay_starts_no_child_and_no_activity(env: Env) -> None:
    @env.activity
    def side(i: int) -> int:
        return i

    def child() -> str:
        return "ran"

    child_def = env.workflow(child)

    def flow() -> None:
        ctx = require_context("test")
        ctx.start_child(child_def, (), {}, None)
        side.start(1)
        wf.start_timer(5)
        raise ValueError("give up")

    ex = env.run(flow, wid="W")
    assert ex["status"] == "failed"
    env.recover()
    assert list(env.store.scan_partitions("W-")) == []
    assert env.worker.executed == []


def test_a_continuing_replay_starts_no_child_of_the_old_run(env: Env) -> None:
    ran: list[int] = []

    def child(n: int) -> int:
        ran.append(n)
        return n

    child_def = env.workflow(child)

    def flow(n: int) -> int:
        if n == 0:
            require_context("test").start_child(child_def, (n,), {}, None)
            wf.continue_as_new(1)
        return n

    ex = env.run(flow, 0, wid="C")
    assert (ex["status"], ex["result"]) == ("completed", 1)
    env.recover()
    assert ran == []
    assert list(env.store.scan_partitions("C-")) == []
