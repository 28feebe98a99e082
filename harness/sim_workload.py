"""The workload of the deterministic simulation (:mod:`harness.sim`).

Workflows and activities written against the engine's context directly (no Celery), so the
simulation runs the real replay/driver/links/recovery code in-process. Activity bodies are pure
functions of their arguments (plus one deliberate first-run failure), so a workflow's outcome is
known from a fault-free run of the same arguments.
"""

from __future__ import annotations

from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.limits.spec import Limit
from celery_durable.engine.registry import Registry
from celery_durable.engine.replay.context import DurableFuture, require_context
from celery_durable.errors import ActivityError, DurableTimeoutError, NonRetryableError

__all__ = ["SIGNAL_TIMEOUT", "LONG_TIMEOUT", "LIMITS", "build_registry", "ActivityLedger", "set_ledger"]

#: how long a signal wait lasts before its timeout fires (simulated seconds)
SIGNAL_TIMEOUT = 40.0
#: a timeout that fires only once the fault phase is over (no signal can race it)
LONG_TIMEOUT = 3600.0


class ActivityLedger:
    """What activity bodies did in one simulation (bodies are at-least-once: they may repeat)."""

    def __init__(self) -> None:
        self.flaky_failed: dict[str, bool] = {}
        self.bodies = 0


_ledger = ActivityLedger()


def set_ledger(ledger: ActivityLedger) -> None:
    global _ledger
    _ledger = ledger


def act(name: str, *args: Any) -> DurableFuture[Any]:
    """Schedule activity ``name`` from workflow code; return its future."""
    ctx = require_context(name)
    definition = ctx.registry.activity(name)
    assert definition is not None, name
    return ctx.call_activity(name, definition.codec, args, {}, definition.options or None)


def child(name: str, *args: Any) -> DurableFuture[Any]:
    ctx = require_context(name)
    definition = ctx.registry.workflow(name)
    assert definition is not None, name
    return ctx.start_child(definition, args, {}, None)


# --- activities -----------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    _ledger.bodies += 1
    return a + b


def square(x: int) -> int:
    _ledger.bodies += 1
    return x * x


def echo(x: str) -> str:
    _ledger.bodies += 1
    return x


def flaky(key: str) -> str:
    """Fails the first time its body runs for ``key`` (then succeeds on retry)."""
    _ledger.bodies += 1
    if not _ledger.flaky_failed.get(key):
        _ledger.flaky_failed[key] = True
        raise RuntimeError(f"flaky {key} first attempt")
    return key


def doomed(x: str) -> str:
    _ledger.bodies += 1
    raise NonRetryableError(f"doomed {x}")


def reserve(item: str) -> str:
    _ledger.bodies += 1
    return f"reserved {item}"


def release(item: str) -> str:
    _ledger.bodies += 1
    return f"released {item}"


#: limited activities (engine/limits/; harness/sim_limits.py): at most 2 charges of one key at
#: once, at most 3 pings a minute (one key), shared by every workflow of a seed
LIMITS = {
    "charge": Limit("sim.charge", max_running=2, key=lambda key, tag, n: key),
    "ping": Limit("sim.ping", rate="3/m"),
}


def charge(key: str, tag: str, n: int) -> str:
    """Under ``sim.charge``; fails the first time its body runs for every third ``n`` (a retry
    gives its slot back and takes one again)."""
    _ledger.bodies += 1
    if n % 3 == 0 and not _ledger.flaky_failed.get(f"charge/{tag}/{n}"):
        _ledger.flaky_failed[f"charge/{tag}/{n}"] = True
        raise RuntimeError(f"charge {tag}/{n} first attempt")
    return f"{key}:{n}"


def ping(n: int) -> int:
    """Under ``sim.ping`` (a rate)."""
    _ledger.bodies += 1
    return n + 1


# --- workflows ------------------------------------------------------------------------------


def w_seq(n: int) -> int:
    total = 0
    for i in range(n):
        total = act("add", total, i).result()
    return total


def w_fan(n: int, key: str) -> int:
    values = wf.gather([act("square", i) for i in range(n)])
    return int(sum(values)) + len(act("flaky", key).result())


def w_timer(secs: float) -> str:
    wf.sleep(secs)
    first = str(act("echo", "woke").result())
    wf.sleep(secs / 2)
    try:
        act("doomed", first).result()
    except ActivityError as exc:
        return f"{first}:{exc.type_name}"
    return "unreachable"


def w_signal(rounds: int, seen: list[str | None], timeout: float = SIGNAL_TIMEOUT) -> list[str | None]:
    """One signal wait (with a timeout) per run, then continue-as-new: returns what each run saw."""
    try:
        value: str | None = wf.wait_signal("tick", str, timeout=timeout)
    except DurableTimeoutError:
        value = None
    seen = [*seen, value]
    if rounds > 1:
        wf.continue_as_new(rounds - 1, seen, timeout)
    return seen


def w_fail(extra: int) -> int:
    """Some steps, then one that fails the execution (an operator may retry or reset it)."""
    total = 0
    for i in range(2 + extra):
        total = int(act("add", total, i).result())
    wf.gather([act("square", i) for i in range(extra)])
    return int(act("doomed", str(total)).result())


def w_child(n: int) -> int:
    if n:
        wf.sleep(n * 5.0)
    return int(act("add", n, n).result())


def w_parent(ns: list[int]) -> list[int]:
    futures = [child("w_child", n) for n in ns]
    return [int(f.result()) for f in futures]


def _compensate(name: str, item: str) -> None:
    act(name, item).result()


def w_saga(item: str) -> str:
    with wf.Saga() as saga:
        act("reserve", item).result()
        saga.add(_compensate, "release", item)
        act("reserve", item + "+").result()
        saga.add(_compensate, "release", item + "+")
        wf.sleep(60.0)
        act("echo", "ship").result()
    return "shipped"


def w_counter(n: int, total: int, activity: bool, pad: str = "") -> int:
    """Continue-as-new ``n`` times; each run adds ``n`` with an activity (or inline, after a
    recorded side effect: nothing of an old run can then complete late). ``pad`` halves each
    run: a large input (its own document) turns small (inline in the exec), and the last run's
    length is in the result, so a run given another run's input shows."""
    if activity:
        total = int(act("add", total, n).result())
    else:
        wf.uuid4()
        total += n
    if n > 0:
        wf.continue_as_new(n - 1, total, activity, pad[: len(pad) // 2])
    return total + len(pad)


def w_limited(n: int, keys: list[str], tag: str) -> list[str]:
    """A fan-out of ``n`` charges over ``keys`` (each key at most 2 at once across the seed)."""
    return sorted(str(v) for v in wf.gather([act("charge", keys[i % len(keys)], tag, i) for i in range(n)]))


def w_rated(n: int) -> int:
    """A fan-out of ``n`` pings, then one more (at most 3 a minute across the seed)."""
    first = sum(int(v) for v in wf.gather([act("ping", i) for i in range(n)]))
    return first + int(act("ping", n).result())


def w_generations(g: int) -> int:
    """Run 0 has a child at step 11, run 1 at step 1 (issue 10 bug 4: child ids collide)."""
    if g == 0:
        wf.gather([act("echo", str(i)) for i in range(10)])
        first = int(child("w_child", 0).result())
        wf.continue_as_new(1)
        return first
    return int(child("w_child", 1).result())


def w_update(n: int, runs: int) -> int:
    """Takes updates (harness/sim_updates.py): ``add(token, amount)`` appends the token (its
    validator rejects a negative amount) and answers how many it holds; a query reads them. Its
    result does not depend on them: a fault-free run without updates ends alike."""
    seen: list[str] = []

    def check(token: str, amount: int) -> None:
        if amount < 0:
            raise ValueError(f"negative amount {amount}")

    def apply(token: str, amount: int) -> int:
        seen.append(token)
        return len(seen)

    wf.set_update_handler("add", apply, validator=check)
    wf.set_query_handler("seen", lambda: list(seen))
    total = 0
    for i in range(n):
        total = act("add", total, i).result()  # wait points: updates apply here
    if runs > 1:
        wf.continue_as_new(n, runs - 1)
    return total


ACTIVITIES = (add, square, echo, flaky, doomed, reserve, release, charge, ping)
WORKFLOWS = (
    w_seq,
    w_fan,
    w_timer,
    w_signal,
    w_child,
    w_parent,
    w_saga,
    w_counter,
    w_generations,
    w_fail,
    w_limited,
    w_rated,
    w_update,
)

_registry: Registry | None = None


def build_registry() -> Registry:
    """The simulation's registry (built once per process: codecs are not free)."""
    global _registry
    if _registry is None:
        reg = Registry()
        for fn in ACTIVITIES:
            limit = LIMITS.get(fn.__name__)
            reg.add_activity(fn.__name__, fn, {"limit": limit} if limit is not None else None)
        for w in WORKFLOWS:
            # a declared signal: every value is kept, each wait consumes the next (a channel)
            reg.add_workflow(w.__name__, w, signals={"tick": str} if w is w_signal else None)
        _registry = reg
    return _registry
