"""Attempts to break eager activities (``durable_eager_activities``) with real workers: each test
asserts what a delivered activity would do (README "Eager activities")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.errors import DurableError
from tests.apps import eager_adv
from tests.integration.eager_logs import eager_steps as _eager_steps
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.eager_adv"


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    with cluster.client_of(eager_adv, tmp_path / "marks") as durable:
        yield durable


@pytest.mark.parametrize("eager", ["0", "10"])
def test_each_activity_sees_the_one_that_scheduled_it_as_its_parent(cluster: Any, fx: Any, eager: str) -> None:
    """A delivered activity's message is sent from the delivery of the step before it (its
    inline drive), so Celery gives it ``parent_id`` = that step's task id. An eager one must see
    the same (README: "the request a delivery would have"); so must what it ``.delay()``s."""
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": eager})
    key = uuid.uuid4().hex[:6]
    h = eager_adv.who.start(key, 4)
    seen = h.result(timeout=60)
    if eager != "0":
        assert _eager_steps(worker, h.id), "nothing ran eagerly"
    ids = [s["id"] for s in seen]
    assert len({s["root_id"] for s in seen}) == 1
    parents = [s["parent_id"] for s in seen[1:]]
    assert parents == ids[:-1], f"parent_id of steps 2..4: {parents}, their predecessors: {ids[:-1]}"
    wait_until(lambda: all(eager_adv.notes(f"record-{key}-{i}") for i in range(4)), timeout=30, what="records")
    for i, s in enumerate(seen):
        rec = eager_adv.notes(f"record-{key}-{i}")[0]
        assert (rec["parent_id"], rec["root_id"]) == (s["id"], s["root_id"])


def test_a_worker_soft_time_limit_on_the_command_line_is_a_time_limit(cluster: Any, fx: Any) -> None:
    """README: kept only with "no time limit on either task or in the worker (a pool's time limit
    covers one message)". ``celery worker --soft-time-limit`` is the worker's time limit: each
    step takes 1.2 s < 3 s, so delivered one by one none is interrupted; run 3 in a row under one
    message's limit, the third gets SoftTimeLimitExceeded and the workflow fails."""
    worker = cluster.start_worker(app=APP, extra=["--soft-time-limit", "3"])
    h = eager_adv.slow_steps.start(4, 1.2)
    try:
        value = h.result(timeout=90)
    except DurableError as exc:
        value = repr(exc)
    assert value == 4, f"eager steps {_eager_steps(worker, h.id)}"
    assert _eager_steps(worker, h.id) == [], "eager runs under a worker time limit"


def test_a_worker_hard_time_limit_on_the_command_line_is_a_time_limit(cluster: Any, fx: Any) -> None:
    """``celery worker --time-limit 3``: each 1.2 s step fits in it as one message; eager steps
    run under the message that kept them, and the pool kills the process mid-step."""
    worker = cluster.start_worker(app=APP, extra=["--time-limit", "3"])
    h = eager_adv.slow_steps.start(4, 1.2)
    wait_until(lambda: h.status() != "running" or "Hard time limit" in worker.log(), timeout=60, what="an end")
    assert "Hard time limit" not in worker.log(), (
        f"a process killed by the time limit (eager steps {_eager_steps(worker, h.id)})"
    )
    assert h.result(timeout=5) == 4


def test_a_rate_limited_activity_keeps_its_rate_limit(cluster: Any, fx: Any) -> None:
    """``rate_limit="12/m"``: a worker starts at most one every 5 s (Celery's token bucket, at
    consumption). Eager runs are not consumed: they must not start faster."""
    worker = cluster.start_worker(app=APP, concurrency=1)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.rated_steps.start(key, 3)
    assert h.result(timeout=90) == 3
    times = [n["t"] for n in eager_adv.notes(f"rated-{key}")]
    gaps = [round(b - a, 2) for a, b in zip(times, times[1:], strict=False)]
    ran = _eager_steps(worker, h.id)
    assert all(g >= 4.0 for g in gaps), f"starts {gaps} s apart (eager steps {ran}); the rate limit is 1 per 5 s"


def _ran(key: str) -> list[str]:
    return [n["what"] for n in eager_adv.notes(f"ran-{key}")]


POOLS = [("prefork", 2), ("threads", 2), ("solo", 1)]


@pytest.mark.parametrize(("pool", "c"), POOLS)
def test_celery_semantics_of_kept_activities(cluster: Any, fx: Any, pool: str, c: int) -> None:
    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.semantics.start(key)
    out = h.result(timeout=90)
    assert out["a"] == 1 and out["aio"] == 3
    assert out["bound"]["retries"] == 2 and out["bound"]["id"] == f"{h.id}:2"
    assert out["exhaust"] == ["ConnectionError", 2]
    assert out["refuse"] == ["NonRetryableError", 1]
    assert sorted(_ran(key)) == sorted(
        ["add 0 1", "bound_retry 0", "bound_retry 1", "bound_retry 2", "exhaust", "exhaust", "refuse", "aio"]
    )
    br = eager_adv.notes(f"br-{key}")
    assert [b["retries"] for b in br] == [0, 1, 2] and {b["id"] for b in br} == {f"{h.id}:2"}
    assert all("durable_step" in b["headers"] for b in br)
    assert _eager_steps(worker, h.id), "nothing ran eagerly"


@pytest.mark.parametrize(("pool", "c"), POOLS)
def test_mixed_workflow_children_timers_signals_locals(cluster: Any, fx: Any, pool: str, c: int) -> None:
    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.mixed.start(key)
    wait_until(lambda: "add 24 1" in _ran(key), timeout=60, what="the child to finish")
    wait_until(lambda: h.signal("go", 5) is not None, timeout=5, what="signal")
    assert h.result(timeout=60) == [1, 11, 21, 31, 22, 23, 25, 30]
    assert sorted(_ran(key)) == sorted(
        ["add 0 1", "add 1 10", "add 1 20", "add 1 30", "loc 11", "add 22 1", "add 23 1", "add 24 1", "add 25 5"]
    )
    assert _eager_steps(worker, h.id), "nothing ran eagerly"


@pytest.mark.parametrize(("pool", "c"), POOLS)
def test_concurrent_workflows_do_not_cross(cluster: Any, fx: Any, pool: str, c: int) -> None:
    cluster.start_worker(app=APP, pool=pool, concurrency=c, env={"TEST_EAGER_ACTIVITIES": "3"})
    keys = [uuid.uuid4().hex[:6] for _ in range(4)]
    handles = [eager_adv.adds.start(k, 7) for k in keys]
    for k, h in zip(keys, handles, strict=True):
        assert h.result(timeout=90) == 7
        assert sorted(_ran(k)) == sorted(f"add {i} 1" for i in range(7)), k


def test_cancel_while_an_eager_activity_runs(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.adds.start(key, 30, 0.4)
    wait_until(lambda: len(_ran(key)) >= 3, timeout=30, what="three steps")
    assert h.cancel()
    wait_until(lambda: h.status() == "cancelled", timeout=30, what="cancelled")
    n = len(_ran(key))
    import time

    time.sleep(3)  # a chain that ignored the cancel would keep running steps (0.4 s each)
    assert len(_ran(key)) <= n + 1, _ran(key)
    assert _eager_steps(worker, h.id)


@pytest.mark.parametrize("eager", ["0", "1"])
def test_an_activity_calling_another_activity_as_a_function(cluster: Any, fx: Any, eager: str) -> None:
    """Calling a Celery task object runs its function (``base(key, x)`` inside ``reuse``): a
    delivered ``reuse`` gets base's value. Run eagerly after a delivery of ``base`` (N=1: the drive
    runs step 1, step 2 is delivered and keeps step 3), the call must still run the function."""
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": eager})
    key = uuid.uuid4().hex[:6]
    h = eager_adv.reuser.start(key)
    try:
        value = h.result(timeout=60)
    except DurableError as exc:
        value = repr(exc)
    if eager != "0":
        assert 3 in _eager_steps(worker, h.id)
    assert value == 103
    assert sorted(_ran(key)) == ["base 0", "base 1", "base 2", "reuse 2"]


@pytest.mark.parametrize(("pool", "c"), [("prefork", 1), ("threads", 1), ("solo", 1)])
def test_a_stopping_worker_starts_no_more_kept_activities(cluster: Any, fx: Any, pool: str, c: int) -> None:
    """README: an activity is kept only with "the worker not stopping; otherwise it is sent as
    usual". After a warm shutdown begins, the activity running finishes; no other one starts
    here (a delivered workflow would have its next message left in the queue)."""
    import time

    worker = cluster.start_worker(app=APP, pool=pool, concurrency=c)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.adds.start(key, 10, 0.5)
    wait_until(lambda: len(_ran(key)) >= 2, timeout=30, what="two steps")
    worker.proc.send_signal(__import__("signal").SIGTERM)
    stop_at = time.time()
    worker.proc.wait(60)
    after = [n for n in eager_adv.notes(f"ran-{key}") if n["t"] > stop_at + 0.6]
    # nothing lost: another worker finishes it, each step once
    cluster.start_worker(app=APP, pool=pool, concurrency=c)
    assert h.result(timeout=60) == 10
    assert sorted(_ran(key)) == sorted(f"add {i} 1" for i in range(10))
    if pool != "prefork":  # a pool child never learns of a warm shutdown: it runs its budget (README)
        assert after == [], f"{len(after)} steps started after the warm shutdown began"


@pytest.mark.parametrize("eager", ["0", "10"])
def test_an_activity_that_starts_a_workflow_and_waits_for_it(cluster: Any, fx: Any, eager: str) -> None:
    """With ``durable_eager_start`` the worker's ``start()`` sends the new workflow's first
    activity itself; an activity that starts a workflow and awaits its result works on a worker
    with a free process (-c 2). Run eagerly, that first activity must not be kept by the
    activity's own drain (it would only run after the activity that waits for it)."""
    worker = cluster.start_worker(app=APP, concurrency=2, env={"TEST_EAGER_ACTIVITIES": eager, "TEST_EAGER_START": "1"})
    key = uuid.uuid4().hex[:6]
    h = eager_adv.triggers.start(key)
    try:
        value = h.result(timeout=60)
    except DurableError as exc:
        value = repr(exc)[:300]
    assert value == 102, f"{value} (eager steps {_eager_steps(worker, h.id)})"


def test_the_budget_counts_every_eager_run(cluster: Any, fx: Any) -> None:
    """N=2: the drive runs steps 1 and 2, step 3 is sent; its delivery runs 4 and 5; 6 is sent and
    runs 7. No more than N in a row, none twice, none lost."""
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": "2"})
    key = uuid.uuid4().hex[:6]
    h = eager_adv.adds.start(key, 7)
    assert h.result(timeout=60) == 7
    assert sorted(_ran(key)) == sorted(f"add {i} 1" for i in range(7))
    assert _eager_steps(worker, h.id) == [1, 2, 4, 5, 7]


def test_a_router_function_routing_by_task_is_honoured(cluster: Any, fx: Any) -> None:
    """Celery calls a router function with ``task=`` the task (``route(name, args, kwargs,
    options, task=None, **kw)`` in Celery's routing docs): ``on_gpu`` (``gpu=True``) goes to the
    gpu queue when sent. It must not be run here from a delivery of the default queue."""
    gpu = f"{cluster.queue}-gpu"
    worker = cluster.start_worker(app=APP, env={"TEST_GPU_QUEUE": gpu}, extra=["-Q", f"{cluster.queue},{gpu}"])
    key = uuid.uuid4().hex[:6]
    h = eager_adv.gpu_flow.start(key)
    value = h.result(timeout=60)
    assert 2 not in _eager_steps(worker, h.id), "on_gpu ran eagerly from the default queue"
    assert value == [2, gpu]


@pytest.mark.parametrize(("pool", "c"), [("prefork", 2), ("threads", 2)])
def test_killed_in_an_eager_activity_kept_by_a_drive(cluster: Any, fx: Any, pool: str, c: int) -> None:
    """The drive message is acked on receipt (acks_late=False): the step it kept and began is
    recovered only through its lease; with beat running recovery it completes, once."""
    env = {"TEST_LEASE_TTL": "3", "TEST_HEARTBEAT": "1", "TEST_RECOVERY_INTERVAL": "1"}
    w = cluster.start_worker(app=APP, pool=pool, concurrency=c, env=env)
    cluster.workers.start_beat(app=APP, env=env)
    key = uuid.uuid4().hex[:6]
    h = eager_adv.dies.start(key)
    if pool == "threads":  # the whole worker died: start another
        wait_until(lambda: w.proc.poll() is not None, timeout=30, what="the worker to die")
        cluster.start_worker(app=APP, pool=pool, concurrency=c, env=env)
    assert h.result(timeout=90) == 2
    assert len(eager_adv.notes(f"die-{key}")) == 2
    assert _ran(key) == ["add 1 1"]


def test_a_store_outage_after_the_keep_loses_nothing(cluster: Any, fx: Any) -> None:
    """Step 1's commit schedules an activity (kept) and a child; starting the child meets a store
    outage: the delivery retries with its outcome, and the kept activity must be sent."""
    env = {"TEST_INJECT_OUTAGE": "1", "TEST_RECOVERY_INTERVAL": "1", "TEST_QUEUE_TIMEOUT": "5"}
    worker = cluster.start_worker(app=APP, env=env)
    cluster.workers.start_beat(app=APP, env=env)
    key = uuid.uuid4().hex[:6]
    eager_adv.MARKS.mkdir(parents=True, exist_ok=True)
    (eager_adv.MARKS / "outage-child").write_text("1")
    h = eager_adv.both.start(key)
    assert h.result(timeout=60) == [1, 2, 3, 5]
    assert not (eager_adv.MARKS / "outage-child").exists(), "the outage was not met"
    assert sorted(_ran(key)) == sorted(["add 0 1", "add 1 1", "add 1 1", "add 2 1", "add 2 3"])
    assert "injected outage" in worker.log()
