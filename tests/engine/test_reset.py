"""Reset (issue 13, item 6): an operator re-runs a failed or cancelled execution from a chosen
step, as a recorded action, in one rewrite that bumps ``generation``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("reset-tests", set_as_current=False)
durable = Durable(app, store="memory://")
ran: list[str] = []
broken = {"charge": True}


@durable_activity(name="rs.reserve")
def reserve(order: str) -> str:
    ran.append("reserve")
    return f"reserved {order}"


@durable_activity(name="rs.charge")
def charge(order: str) -> str:
    ran.append("charge")
    if broken["charge"]:
        raise ValueError("card declined")
    return f"charged {order}"


@durable.workflow(name="rs.order", signals={"go": str})
def order(o: str) -> list[str]:
    done = [reserve(o)]
    done.append(wf.wait_signal("go"))
    done.append(charge(o))
    return done


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()
    broken["charge"] = True


def _failed(env: WorkflowEnvironment) -> Any:
    h = env.start(order, "o1")
    env.signal(h, "go", "first")
    assert h.status() == "failed"
    return h


def test_reset_failed_execution_from_a_step_reruns_it_and_what_follows() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env)
    gen = env.store.read(h.id, "exec")["generation"]  # type: ignore[index]
    broken["charge"] = False
    rerun = h.reset(step=2, by="alice", reason="card fixed")
    assert [s.seq for s in rerun] == [2, 3]
    env.run_until_idle()
    # the value consumed by step 2 is pending again: the re-run takes it, nothing waits
    assert env.result(h) == ["reserved o1", "first", "charged o1"]
    assert ran == ["reserve", "charge", "charge"]  # step 1 kept its outcome
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["generation"] > gen and ex["operations"] == 1
    (op,) = Admin(env.engine).describe(h.id).operations
    assert (op["action"], op["by"], op["step"], op["status"], op["reason"]) == (
        "reset",
        "alice",
        2,
        "failed",
        "card fixed",
    )
    assert op["error"]["type"] == "ActivityError"


def test_reset_from_step_one_reruns_everything() -> None:
    env = WorkflowEnvironment(durable)
    h = _failed(env)
    broken["charge"] = False
    assert [s.seq for s in h.reset(step=1)] == [1, 2, 3]
    env.run_until_idle()
    assert env.result(h) == ["reserved o1", "first", "charged o1"]
    assert ran == ["reserve", "charge", "reserve", "charge"]
    (op,) = Admin(env.engine).describe(h.id).operations
    assert "@" in op["by"]  # user@host by default


def test_reset_cancelled_execution_withdraws_the_cancel() -> None:
    env = WorkflowEnvironment(durable)
    broken["charge"] = False
    h = env.start(order, "o2")
    env.cancel(h)
    assert h.status() == "cancelled"
    h.reset(step=2)
    env.run_until_idle()
    assert h.status() == "running"  # waiting for "go" again
    env.signal(h, "go", "later")
    assert env.result(h) == ["reserved o2", "later", "charged o2"]


def test_reset_refuses_what_does_not_apply() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(order, "o3")
    with pytest.raises(OperationRefused, match="running"):
        h.reset(step=1)
    env.signal(h, "go", "x")
    with pytest.raises(OperationRefused, match="steps 1 to 3"):
        h.reset(step=7)
    with pytest.raises(OperationRefused, match="steps 1 to 3"):
        h.reset(step=0)
    assert Admin(env.engine).describe(h.id).operations == ()


def test_a_warm_cache_elsewhere_sees_the_reset_not_a_mix() -> None:
    """Another worker's partition cache, warm before the reset, reads the partition afresh (the
    generation bump): it never holds the forgotten outcomes next to the re-run's documents."""
    from celery_durable.engine.core import Engine
    from celery_durable.engine.dispatcher import InlineDispatcher

    env = WorkflowEnvironment(durable)
    h = _failed(env)
    other = Engine(env.store, InlineDispatcher(), env.engine.registry, env.engine.settings, env.clock)
    assert "r:000003" in other.cache.load(h.id)  # warm, with the failed outcome
    h.reset(step=2)
    docs = other.cache.load(h.id)
    assert not {"s:000002", "w:000002", "r:000003", "s:000003"} & set(docs)
    assert docs["exec"]["status"] == "running" and docs["exec"]["steps"] == 1


@durable_activity(name="rs.refund")
def refund(order: str) -> str:
    ran.append("refund")
    return f"refunded {order}"


@durable.workflow(name="rs.saga", signals={"go": str})
def saga(o: str) -> list[str]:
    done = []
    with wf.Saga() as s:
        done.append(charge(o))
        s.add(refund, o)
        done.append(wf.wait_signal("go"))  # the cancel lands here (step 3)
    return done


def test_reset_of_a_cancelled_saga_into_its_compensations_is_refused() -> None:
    """Found by the simulation (trigger operator_compensations): reset to a step after the cancel
    point kept the compensations recorded before it while it withdrew the cancel, so the re-run
    (not cancelled) met a refund step where its code waits for a signal: it failed with
    NonDeterminismError. Now refused, nothing written; a reset to the step after the cancel
    point forgets the compensations and re-runs cleanly."""
    env = WorkflowEnvironment(durable)
    broken["charge"] = False
    h = env.start(saga, "o9")
    env.run_until_idle()
    env.cancel(h)
    assert h.status() == "cancelled"
    assert ran == ["charge", "refund"]
    steps = [(s.seq, s.name) for s in Admin(env.engine).describe(h.id).steps]
    assert steps[:2] == [(1, "rs.charge"), (2, "go")] and steps[2][1] == "rs.refund", steps
    before = env.engine.store.query_partition(h.id).docs
    with pytest.raises(OperationRefused, match="cancelled after step 2: its steps from 3 on"):
        h.reset(step=4)
    assert env.engine.store.query_partition(h.id).docs == before  # nothing written
    h.reset(step=3)
    env.signal(h, "go", "now")
    assert env.result(h) == ["charged o9", "now"]
    assert ran == ["charge", "refund"]  # the refund that ran is recorded as forgotten, not re-run
