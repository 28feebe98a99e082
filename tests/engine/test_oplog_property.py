"""Nothing that ran is forgotten, under random operator sequences (issue 23, item 4).

Seeded simulation: a Saga workflow whose activities fail at random (the failure odds change
between operations), driven by random cancels, signals, retries, resumes and resets, in any
order (refused ones included), some of them cut by a store failure between the batches of their
rewrite (batches made small so a rewrite takes several). After every operation: each activity
or compensation that completed, at any time, appears in ``describe()`` exactly once, either as a
live step in state ok or as a superseded one (state ok) archived by the operation that forgot
it; and every operation that applied left exactly one record, with who and when.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.errors import StoreUnavailable
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("oplog-property", set_as_current=False)
durable = Durable(app, store="memory://")
#: (execution, activity) of every activity run that completed, in order
RAN: list[tuple[str, str]] = []
ODDS = {"fail": 0.0}
RNG = random.Random(0)


def _maybe_fail(what: str) -> None:
    if RNG.random() < ODDS["fail"]:
        raise NonRetryableError(f"{what} failed (simulated)")


@durable_activity(name="pp.book")
def book(eid: str, i: int) -> str:
    _maybe_fail("book")
    RAN.append((eid, "pp.book"))
    return f"booked {i}"


@durable_activity(name="pp.unbook")
def unbook(eid: str, i: int) -> str:
    _maybe_fail("unbook")
    RAN.append((eid, "pp.unbook"))
    return f"unbooked {i}"


@durable_activity(name="pp.ship")
def ship(eid: str) -> str:
    _maybe_fail("ship")
    RAN.append((eid, "pp.ship"))
    return "shipped"


@durable.workflow(name="pp.trip", signals={"go": int})
def trip(eid: str, legs: int) -> str:
    with wf.Saga() as saga:
        for i in range(legs):
            book(eid, i)
            saga.add(unbook, eid, i)
        wf.wait_signal("go")
        return ship(eid)


def _check(env: WorkflowEnvironment, eid: str, applied: int, trail: list[str]) -> None:
    """``applied``: the operations that must have left a record (cut ones may or may not)."""
    info = Admin(env.engine).describe(eid)
    seen = Counter(s.name for s in info.steps if s.state == "ok" and s.kind == "activity")
    seen.update(s.name for s in info.superseded if s.state == "ok" and s.kind == "activity")
    ran = Counter(name for e, name in RAN if e == eid)
    assert seen == ran, f"ran {dict(ran)} but describe() shows {dict(seen)} after {trail}"
    assert len(info.operations) >= applied, (trail, [o["action"] for o in info.operations])
    assert all(o["by"] and isinstance(o["at"], float) for o in info.operations)
    assert not any(o.get("forgotten_more") for o in info.operations)  # small histories: all archived


def _cut(env: WorkflowEnvironment, rng: random.Random) -> Any:
    """Make the store fail the k-th batch from now (k random), with small batches: the rewrite of
    an operation is cut after k-1 of them. Returns the undo."""
    store, real, room = env.store, env.store.batch, env.store.max_batch_ops
    k, calls = rng.randint(1, 4), [0]

    def batch(pk: str, ops: list[Any]) -> Any:
        calls[0] += 1
        if calls[0] == k:
            raise StoreUnavailable("the store went away between two batches (simulated)")
        return real(pk, ops)

    store.batch, store.max_batch_ops = batch, 5  # type: ignore[method-assign]

    def undo() -> None:
        store.batch, store.max_batch_ops = real, room  # type: ignore[method-assign]

    return undo


def _op(env: WorkflowEnvironment, h: Any, rng: random.Random) -> tuple[str, bool]:
    """One random operator action; whether it applied (so must be recorded)."""
    kind = rng.choice(["cancel", "signal", "retry", "resume", "reset", "reset", "odds"])
    if kind in ("retry", "resume", "reset") and rng.random() < 0.3:
        undo = _cut(env, rng)  # only the operation's own batches: the drives it sends run after
        try:
            return _act(env, h, rng, kind)[0], False  # a refusal, or a rewrite of fewer batches
        except StoreUnavailable:
            return kind + " (cut)", False
        finally:
            undo()
    return _act(env, h, rng, kind)


def _act(env: WorkflowEnvironment, h: Any, rng: random.Random, kind: str) -> tuple[str, bool]:
    adm = Admin(env.engine)
    ex = env.store.read(h.id, "exec") or {}
    try:
        if kind == "cancel":
            recorded = ex.get("status") == "running" and not ex.get("cancel_requested")
            h.cancel(by=f"op{rng.randrange(9)}")
            return kind, recorded
        if kind == "signal":
            env.signal(h, "go", rng.randrange(100))  # a program's signal: not an operator action
            return kind, False
        if kind == "odds":
            ODDS["fail"] = rng.choice([0.0, 0.3, 0.5, 0.8])
            return kind, False
        if kind == "retry":
            adm.retry(h.id, by="sim", reason=f"seed op {rng.randrange(99)}")
        elif kind == "resume":
            adm.resume(h.id, by="sim")
        else:
            adm.reset(h.id, rng.randint(1, int(ex.get("steps") or 0) + 1), by="sim")
        return kind, True
    except OperationRefused:
        return kind + " (refused)", False


@pytest.mark.parametrize("seed", range(40))
def test_nothing_that_ran_is_forgotten_under_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    RNG.seed(seed)
    ODDS["fail"] = rng.choice([0.0, 0.5])
    env = WorkflowEnvironment(durable)
    eid = f"trip-{seed}"
    h = env.start(trip, eid, rng.randint(1, 3), _workflow_id=eid)
    applied, trail = 0, ["start"]
    _check(env, eid, applied, trail)
    for _ in range(20):
        kind, recorded = _op(env, h, rng)
        env.run_until_idle()
        applied += recorded
        trail.append(f"{kind} -> {env.store.read(eid, 'exec')['status']}")  # type: ignore[index]
        _check(env, eid, applied, trail)
