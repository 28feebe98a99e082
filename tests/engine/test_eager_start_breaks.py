"""Adversarial tests of eager start (``durable_eager_start``): the caller's first drive commits
only a suspension that schedules activities or timers, writes nothing otherwise, keeps no live
instance, and any error falls back to the usual drive message."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.errors import StoreUnavailable
from celery_durable.stores.base import strip_reserved
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("eager-adv", set_as_current=False)
durable = Durable(app, store="memory://", eager_start=True)


@durable_activity(name="eager_adv.inc")
def inc(x: int) -> int:
    return x + 1


@durable.workflow(name="eager_adv.two")
def two(x: int) -> int:
    return inc(inc(x))


@durable.workflow(name="eager_adv.waits", signals={"go": int, "note": int})
def waits() -> int:
    return int(wf.wait_signal("go", int))


def sent(env: WorkflowEnvironment) -> list[str]:
    return [kind for kind, _ in env.dispatcher.sent]


# (the live instance left after a store error at the commit: tests/engine/test_eager_start.py)


def test_a_contended_eager_drive_leaves_no_exec_lease_behind() -> None:
    """Signals racing the eager commit (signal-with-start) make it conflict: the caller must not
    take the exec lease and then decline, leaving a worker's drive deferring to a caller that
    drives nothing (the execution waits for the lease to lapse)."""
    env = WorkflowEnvironment(durable)
    eng = env.engine
    batch = eng.store.batch
    calls = 0
    signalling = False
    went: list[int] = []

    def signal(name: str, value: int) -> None:
        nonlocal signalling
        signalling = True
        try:
            eng.signal("sws", name, value)
        finally:
            signalling = False

    def racing(pk: str, ops: Any) -> Any:
        nonlocal calls
        if pk != "sws" or signalling:
            return batch(pk, ops)
        calls += 1
        if calls <= 2:  # a value the wait does not take lands just before each of the first commits
            signal("note", calls)
        got = batch(pk, ops)
        if calls == 3:  # and the awaited one right after the third write (the caller's lease claim)
            signal("go", 7)
            went.append(7)
        return got

    eng.store.batch = racing  # type: ignore[method-assign]
    eng.identity = lambda: "web-1"  # the caller: a web process, not a worker
    try:
        eng.start(waits.definition, (), {}, workflow_id="sws")
    finally:
        eng.store.batch = batch  # type: ignore[method-assign]
        eng.identity = lambda: "worker-1"
    if not went:  # no third write in the caller: the awaited value arrives now
        signal("go", 7)
    ex = eng.store.read("sws", "exec")
    assert ex is not None
    assert not ex.get("lease"), f"the caller holds the exec lease: {ex.get('lease')}"
    env.run_until_idle()  # the workers' drives, without advancing the clock
    ex = eng.store.read("sws", "exec")
    assert ex is not None and ex["status"] == "completed" and ex["result"] == 7


small = Durable(Celery("eager-adv-small", set_as_current=False), store="memory://", eager_start=True, max_payload=2**20)


@durable_activity(name="eager_adv.size")
def size(text: str) -> int:
    return len(text)


@small.workflow(name="eager_adv.too_big")
def too_big(n: int) -> int:
    return size("x" * n)  # an argument larger than the store takes


def test_a_first_step_too_large_to_store_is_failed_by_a_worker_not_the_caller() -> None:
    """A failure is left to a worker, nothing written by the caller: the eager check ran before
    the drive swapped its decision for the failure (DocumentTooLarge at the commit)."""
    env = WorkflowEnvironment(small)
    eid, _ = env.engine.start(too_big.definition, (2 * 2**20,), {})
    ex = env.store.read(eid, "exec")
    assert ex is not None and ex["status"] == "running" and not ex.get("drives"), ex.get("error")
    assert sent(env) == ["drive"]
    env.run_until_idle()
    ex = env.store.read(eid, "exec")
    assert ex is not None and ex["status"] == "failed"


class Halt(BaseException):
    """Workflow code raising a BaseException that is not an interrupt of the caller."""


@durable.workflow(name="eager_adv.exits")
def exits(how: str) -> int:
    if how == "exit":
        raise SystemExit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    raise Halt("stop")


@pytest.mark.parametrize("how", ["exit", "halt"])
def test_workflow_code_raising_a_base_exception_does_not_escape_into_the_caller(how: str) -> None:
    """``sys.exit()`` (or any BaseException) in workflow code is the workflow's failure, a worker's
    to record: ``start()`` returns as without eager start, and the drive message goes (it was
    neither sent nor the error caught: the caller exited, the execution waited drive_timeout)."""
    env = WorkflowEnvironment(durable)
    eid, created = env.engine.start(exits.definition, (how,), {})
    assert created and sent(env) == ["drive"]
    ex = env.store.read(eid, "exec")
    assert ex is not None and ex["status"] == "running" and not ex.get("drives")
    assert env.engine.driver.sticky.held() == []


def test_an_interrupt_in_the_eager_drive_still_sends_the_drive_message() -> None:
    """A KeyboardInterrupt is the caller's: it propagates, but the execution it created is driven
    at once by a worker, not after drive_timeout by recovery."""
    env = WorkflowEnvironment(durable)
    with pytest.raises(KeyboardInterrupt):
        env.engine.start(exits.definition, ("interrupt",), {}, workflow_id="kbd")
    assert sent(env) == ["drive"]
    ex = env.store.read("kbd", "exec")
    assert ex is not None and ex["status"] == "running" and not ex.get("drives")


def test_the_caller_writes_nothing_when_a_worker_holds_the_exec_lease() -> None:
    """A worker took the exec lease while the eager drive ran (a signal's drive under
    contention): the caller has nothing to record, so it must not bump the exec; the lease
    holder drives, and so does the drive message."""
    env = WorkflowEnvironment(durable)
    eng = env.engine
    batch = eng.store.batch
    claimed: list[str] = []

    def worker_claims(pk: str, ops: Any) -> Any:
        if pk == "held" and not claimed:  # just before the caller's commit, a worker claims the exec
            ex = eng.store.read(pk, "exec")
            assert ex is not None
            lease = {"holder": "worker-9", "expires": eng.clock.now() + eng.settings.lease_ttl}
            claimed.append(eng.store.replace(strip_reserved(ex) | {"lease": lease}, if_match=ex["_etag"]))
        return batch(pk, ops)

    eng.store.batch = worker_claims  # type: ignore[method-assign]
    try:
        eng.start(two.definition, (1,), {}, workflow_id="held")
    finally:
        eng.store.batch = batch  # type: ignore[method-assign]
    ex = eng.store.read("held", "exec")
    assert ex is not None and ex["_etag"] == claimed[0], f"the caller wrote the exec: wakeups={ex.get('wakeups')}"
    assert sent(env) == ["drive"]


@durable.workflow(name="eager_adv.wide")
def wide(n: int) -> int:
    return sum(wf.gather(*[inc.s(i) for i in range(n)]))


def test_a_fan_out_wider_than_a_batch_whose_commit_fails_leaves_nothing_from_the_caller() -> None:
    """A first step wider than one store batch was committed in parts (the overflow created
    first, its activities sent whatever happened to the batch): an eager drive whose commit then
    failed had written documents and sent activities, and the drive message went too."""
    env = WorkflowEnvironment(durable)
    eng = env.engine
    n = eng.store.max_batch_ops + 5
    batch = eng.store.batch

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("down for the test")

    eng.store.batch = down  # type: ignore[method-assign]
    try:
        eng.start(wide.definition, (n,), {}, workflow_id="wide")
    finally:
        eng.store.batch = batch  # type: ignore[method-assign]
    assert sent(env) == ["drive"]
    assert [d["id"] for d in eng.store.query_partition("wide").docs] == ["exec"]
    assert env.result(env.handle("wide")) == sum(range(1, n + 1))
