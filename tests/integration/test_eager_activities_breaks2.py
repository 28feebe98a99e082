"""More attempts to break eager activities (``durable_eager_activities``) with real workers:
Celery signals and ``current_task`` of kept activities, continue_as_new in an eager chain,
effects, the sticky cache, pool recycling, RabbitMQ and the filesystem broker."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps import eager_adv2
from tests.plugins.workers import Worker, wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.eager_adv2"


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    app = eager_adv2.app
    env = cluster.workers.env
    transport = "celery_durable.contrib.filesystem:Transport" if cluster.broker.startswith("filesystem") else None
    app.conf.update(
        broker_url=cluster.broker,
        broker_transport_options=json.loads(env.get("TEST_BROKER_OPTIONS") or "{}"),
        broker_transport=transport,
        task_default_queue=cluster.queue,
    )
    app._pool = None
    app.amqp._producer_pool = None
    eager_adv2.durable.configure(store=cluster.store_url)
    env.update(TEST_MARKS_DIR=str(tmp_path / "marks"))
    eager_adv2.MARKS = tmp_path / "marks"
    yield eager_adv2.durable
    eager_adv2.durable.configure(store=None)


def _eager_steps(worker: Worker, execution_id: str) -> list[int]:
    pattern = re.compile(rf"\({re.escape(execution_id)} step (\d+)\): run here, not sent")
    return sorted(int(m.group(1)) for m in pattern.finditer(worker.log()))


def _ran(key: str) -> list[str]:
    return [n["what"] for n in eager_adv2.notes(f"ran-{key}")]


def _signals(execution_id: str) -> Counter[tuple[str, str]]:
    lines = [s for s in eager_adv2.notes("signals") if str(s["id"]).startswith(f"{execution_id}:")]
    assert all(s["req"] == s["id"] for s in lines), [s for s in lines if s["req"] != s["id"]]
    return Counter((s["sig"], s["id"]) for s in lines)


@pytest.mark.parametrize("eager", ["0", "10"])
@pytest.mark.parametrize(("pool", "c"), [("prefork", 2), ("threads", 2), ("solo", 1)])
def test_celery_signals_fire_once_per_kept_activity(cluster: Any, fx: Any, eager: str, pool: str, c: int) -> None:
    """README: ``task_prerun``/``task_postrun`` and the other signals behave as for a delivered
    task: each delivery (each attempt) fires prerun, success or retry, postrun once, naming its id."""
    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c, env={"TEST_EAGER_ACTIVITIES": eager})
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.signalled.start(key)
    assert h.result(timeout=60) == [1, 2, 7, "ValueError", 3]
    if eager != "0":
        assert _eager_steps(worker, h.id), "nothing ran eagerly"
    e = h.id
    want: Counter[tuple[str, str]] = Counter()
    for seq in (1, 2, 4, 5):
        # step 4 fails for good (the workflow catches it): a failed task, as a delivered one is
        outcome = "failure" if seq == 4 else "success"
        want.update({("prerun", f"{e}:{seq}"): 1, (outcome, f"{e}:{seq}"): 1, ("postrun", f"{e}:{seq}"): 1})
    want.update({("prerun", f"{e}:3"): 2, ("retry", f"{e}:3"): 1, ("success", f"{e}:3"): 1, ("postrun", f"{e}:3"): 2})
    wait_until(lambda: _signals(e) == want, timeout=10, what=f"signals {sorted(_signals(e).items())}")


@pytest.mark.parametrize(("pool", "c"), [("prefork", 2), ("threads", 2), ("solo", 1)])
def test_current_task_inside_a_kept_activity(cluster: Any, fx: Any, pool: str, c: int) -> None:
    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c)
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.steps.start(key, 5)
    assert h.result(timeout=60) == 5
    assert _eager_steps(worker, h.id)
    cur = eager_adv2.notes(f"cur-{key}")
    assert [(n["x"], n["id"], n["name"]) for n in cur] == [
        (x, f"{h.id}:{x + 1}", eager_adv2.step.name) for x in range(5)
    ]


@pytest.mark.parametrize(("pool", "c"), [("prefork", 2), ("threads", 2), ("solo", 1)])
def test_continue_as_new_inside_an_eager_chain(cluster: Any, fx: Any, pool: str, c: int) -> None:
    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c)
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.renewing.start(key, 3)
    assert h.result(timeout=60) == 6
    assert sorted(_ran(key)) == sorted(f"step {i}" for i in range(6))
    assert _eager_steps(worker, h.id)


@pytest.mark.parametrize("sticky", ["0", "256"])
@pytest.mark.parametrize(("pool", "c"), [("threads", 2), ("solo", 1), ("prefork", 2)])
def test_sticky_cache_with_interleaved_eager_chains(cluster: Any, fx: Any, sticky: str, pool: str, c: int) -> None:
    cluster.start_worker(app=APP, pool=pool, concurrency=c, env={"TEST_STICKY": sticky, "TEST_EAGER_ACTIVITIES": "3"})
    keys = [uuid.uuid4().hex[:6] for _ in range(4)]
    handles = [eager_adv2.renewing.start(k, 2) for k in keys] + [eager_adv2.steps.start(k, 5) for k in keys]
    for h in handles:
        h.result(timeout=90)
    for k in keys:
        assert sorted(_ran(k)) == sorted([f"step {i}" for i in range(4)] + [f"step {i}" for i in range(5)]), k


def test_effects_enqueued_from_kept_activities(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.effects.start(key, 3)
    assert h.result(timeout=60) == 4
    assert _eager_steps(worker, h.id)
    wait_until(lambda: len(eager_adv2.notes(f"fx-{key}")) >= 4, timeout=30, what="the effects")
    assert sorted(n["i"] for n in eager_adv2.notes(f"fx-{key}")) == [0, 1, 2, 100]


def test_a_child_recycled_after_every_task(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, env={"TEST_MAX_TASKS": "1"})
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.steps.start(key, 6)
    assert h.result(timeout=60) == 6
    assert sorted(_ran(key)) == sorted(f"step {i}" for i in range(6))
    assert _eager_steps(worker, h.id)


@pytest.mark.parametrize("cluster", [("rabbitmq", "sqlite"), ("filesystem", "sqlite")], indirect=True)
def test_other_brokers_run_kept_activities(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.signalled.start(key)
    assert h.result(timeout=60) == [1, 2, 7, "ValueError", 3]
    assert _eager_steps(worker, h.id), f"nothing ran eagerly on {cluster.broker}"
    assert sorted(_ran(key)) == sorted(["step 0", "step 1", "again 0", "again 1", "boom", "step 2"])


@pytest.mark.parametrize("eager", ["0", "10"])
def test_a_kept_activity_has_its_own_priority(cluster: Any, fx: Any, eager: str) -> None:
    """``priority=7`` routed to the task: a delivered attempt's ``request.delivery_info["priority"]`` is
    its message's (7), and ``retry()`` re-sends with it. A kept one must have the same request
    (README: "the request a delivery would have"), not the priority of the delivery that kept it."""
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": eager})
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.prioritised.start(key)
    value = h.result(timeout=60)
    if eager != "0":
        assert 2 in _eager_steps(worker, h.id), "urgent did not run eagerly"
    assert _ran(key) == ["step 0", "urgent 0 7", "urgent 1 7"]
    assert value == [1, [1, 7]]


@pytest.mark.parametrize("eager", ["0", "10"])
def test_a_workflow_that_ends_while_an_activity_is_kept(cluster: Any, fx: Any, eager: str) -> None:
    """The commit of step 1 schedules step 2 (not awaited) and ends the workflow: step 2 is then
    left as a delivered one is (its attempt finds the execution ended and does not run)."""
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": eager})
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.forgetful.start(key)
    assert h.result(timeout=60) == 1
    wait_until(lambda: f"({h.id} step 2) not run" in worker.log(), timeout=15, what="step 2's attempt")
    assert _ran(key) == ["step 0"]


@pytest.mark.parametrize("cluster", [("redis", "cosmos")], indirect=True)
def test_cosmos_store_runs_kept_activities(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    key = uuid.uuid4().hex[:6]
    h = eager_adv2.signalled.start(key)
    assert h.result(timeout=90) == [1, 2, 7, "ValueError", 3]
    assert _eager_steps(worker, h.id), "nothing ran eagerly"
    assert sorted(_ran(key)) == sorted(["step 0", "step 1", "again 0", "again 1", "boom", "step 2"])
