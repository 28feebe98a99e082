"""Regressions of the operator operations (``engine/admin.py``). Moved from ``tests/adversarial``;
the saga test failed before ``retry`` forgot what was recorded after the failed step."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.admin import Admin, OperationRefused
from celery_durable.engine.context import require_context
from celery_durable.engine.local import LocalWorker
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import FakeClock


class Env:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.clock = FakeClock(1_700_000_000.0)
        self.dispatcher = InlineDispatcher()
        self.registry = Registry()
        self.engine = Engine(self.store, self.dispatcher, self.registry, clock=self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher)
        self.admin = Admin(self.engine)
        self.ran: list[str] = []

    def activity(self, fn: Any) -> Any:
        act = self.registry.add_activity(fn.__name__, fn)

        def call(*args: Any, **kwargs: Any) -> Any:
            return require_context("activity").call_activity(act.name, act.codec, args, kwargs).result()

        return call

    def run(self) -> None:
        self.clock.advance(1.0)
        self.worker.run()

    def ex(self, eid: str) -> dict[str, Any]:
        return self.engine.read_exec(eid)

    def ids(self, eid: str) -> set[str]:
        return {d["id"] for d in self.store.query_partition(eid).docs}


@pytest.fixture
def env() -> Env:
    return Env()


def _saga(env: Env, fixed: dict[str, bool]) -> Any:
    @env.activity
    def reserve() -> str:
        env.ran.append("reserve")
        return "r"

    @env.activity
    def release() -> str:
        env.ran.append("release")
        return "released"

    @env.activity
    def charge() -> str:
        env.ran.append("charge")
        if not fixed:
            raise ConnectionError("card processor down")
        return "charged"

    @env.activity
    def ship() -> str:
        env.ran.append("ship")
        return "shipped"

    def order() -> str:
        with wf.Saga() as saga:
            reserve()
            saga.add(release)
            charge()
            ship()
        return "done"

    return env.registry.add_workflow("order", order)


def test_retry_of_a_saga_reruns_from_the_failed_step(env: Env) -> None:
    """A workflow that compensated before failing has steps recorded *after* the failed step; retry
    kept them, so the re-run met the compensation where the code now goes on (NonDeterminismError)."""
    fixed: dict[str, bool] = {}
    eid, _ = env.engine.start(_saga(env, fixed), (), {}, workflow_id="adv-order")
    env.run()
    assert env.ex(eid)["status"] == "failed"
    assert env.ran == ["reserve", "charge", "release"]
    generation = int(env.ex(eid).get("generation") or 0)

    fixed["yes"] = True
    rerun = env.admin.retry(eid)
    assert [(s.seq, s.name) for s in rerun] == [(2, "charge")]
    ex = env.ex(eid)
    assert ex["status"] == "running" and ex["steps"] == 2 and int(ex["generation"]) > generation
    assert {"s:000003", "r:000003"}.isdisjoint(env.ids(eid))  # the compensation is forgotten
    env.run()
    ex = env.ex(eid)
    assert (ex["status"], ex.get("error")) == ("completed", None), ex.get("error")
    assert ex["result"] == "done"
    assert env.ran == ["reserve", "charge", "release", "charge", "ship"]


def test_retry_forgets_signal_decisions_after_the_failed_step(env: Env) -> None:
    """A value consumed by a wait after the failed step is pending again: the re-run takes it."""
    fixed: dict[str, bool] = {}

    @env.activity
    def flaky() -> str:
        if not fixed:
            raise ValueError("bad")
        return "ok"

    def flow() -> str:
        try:
            first = flaky()
        except Exception:
            wf.now()  # the failure path records other steps than the re-run will take
            got = wf.wait_signal("go", str)  # after the failure: a compensation waiting for a human
            raise RuntimeError(f"gave up after {got}") from None
        return first + ":" + wf.wait_signal("go", str)

    d = env.registry.add_workflow("flow", flow)
    eid, _ = env.engine.start(d, (), {}, workflow_id="sig-retry")
    env.run()
    assert env.engine.signal(eid, "go", "v1") is True
    env.run()
    assert env.ex(eid)["status"] == "failed"
    fixed["yes"] = True
    env.admin.retry(eid)
    env.run()
    ex = env.ex(eid)
    assert (ex["status"], ex["result"]) == ("completed", "ok:v1"), ex.get("error")


def test_retry_forgets_finished_children_of_later_steps_and_refuses_while_one_runs(env: Env) -> None:
    """A child started after the failed step belongs to the forgotten history. A finished one is
    deleted, so the re-run starts its own under the same derived id; a running one would outlive
    the history it belongs to, so retry refuses until it has ended (cancel it first)."""
    fixed: dict[str, bool] = {}

    @env.activity
    def flaky() -> str:
        env.ran.append("flaky")
        if not fixed:
            raise ValueError("bad")
        return "ok"

    def kid(tag: str) -> str:
        env.ran.append(f"kid {tag}")
        if tag == "wait":
            wf.wait_signal("never", str)
        return tag

    kid_def = env.registry.add_workflow("kid", kid)

    def parent(tag: str) -> str:
        try:
            flaky()
        except Exception:
            kid_future = require_context("child").start_child(kid_def, (tag,), {}, None)
            wf.sleep(10)  # recorded and suspended: the child is started
            if tag != "wait":
                kid_future.result()
            raise
        return "done"

    d = env.registry.add_workflow("parent", parent)
    eid, _ = env.engine.start(d, ("x",), {}, workflow_id="P")
    env.run()
    env.clock.advance(10)
    env.engine.links.fire_due_clocks()
    env.run()
    assert env.ex(eid)["status"] == "failed" and env.ex("P-c2")["status"] == "completed"
    fixed["yes"] = True
    env.admin.retry(eid)
    assert "exec" not in env.ids("P-c2")  # forgotten with the step that started it
    env.run()
    assert env.ex(eid)["status"] == "completed"

    eid, _ = env.engine.start(d, ("wait",), {}, workflow_id="Q")
    fixed.clear()
    env.run()
    env.clock.advance(10)
    env.engine.links.fire_due_clocks()
    env.run()
    assert env.ex(eid)["status"] == "failed" and env.ex("Q-c2")["status"] == "running"
    fixed["yes"] = True
    with pytest.raises(OperationRefused, match="Q-c2"):
        env.admin.retry(eid)
    assert env.ex(eid)["status"] == "failed"
    env.engine.cancel("Q-c2")
    env.run()
    env.admin.retry(eid)
    env.run()
    assert (env.ex(eid)["status"], env.ex(eid)["result"]) == ("completed", "done")


def test_retry_refuses_while_a_later_step_is_still_running(env: Env) -> None:
    """Its outcome would land on whatever step the re-run records under the same number."""
    eid, _ = env.engine.start(_saga(env, {}), (), {}, workflow_id="busy")
    env.run()
    marker = env.store.read(eid, "s:000003")  # the compensation, made to look still running
    assert marker is not None and env.ex(eid)["status"] == "failed"
    lease = {"holder": "elsewhere", "expires": env.clock.now() + 60}
    env.store.replace({k: v for k, v in marker.items() if not k.startswith("_")} | {"lease": lease}, marker["_etag"])
    with pytest.raises(OperationRefused, match="step 3 .release. of busy is still running"):
        env.admin.retry(eid)
    assert env.ex(eid)["status"] == "failed" and "r:000003" in env.ids(eid)
