"""Operator operations are all or nothing (issue 23 item 3, engine/admin/pending_ops.py).

A bad input is refused before the first write (nothing changes); a rewrite wider than one batch
that dies between its batches (a store error, a killed process, before or after the batch
applied) leaves the old state or a recorded ``pending_op`` that the next touch (an admin call,
the driver, the recovery scan) finishes, to the same history a clean run of the op leaves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.engine.admin.pending_ops import PENDING
from celery_durable.errors import PayloadValidationError, StoreUnavailable, UnknownWorkflowError, WorkflowCancelledError
from celery_durable.stores.base import Op, Store
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("pending-ops-tests", set_as_current=False)
durable = Durable(app, store="memory://")
RUNS: Counter[str] = Counter()
N = 150  # steps: a rewrite of them spans several batches (100 operations each)


@durable_activity(name="po.ok")
def ok(i: int) -> int:
    RUNS[f"ok{i}"] += 1
    return i


@durable_activity(name="po.undo")
def undo(i: int) -> int:
    RUNS[f"undo{i}"] += 1
    return i


@durable_activity(name="po.boom")
def boom() -> int:
    RUNS["boom"] += 1
    raise NonRetryableError("the step that fails")


@durable.workflow(name="po.long")
def long_(n: int) -> int:
    s = sum(ok(i) for i in range(n))
    return s + boom()


@durable.workflow(name="po.saga")
def saga(n: int) -> int:
    """Fails at step 1, then compensates with ``n`` steps: a retry forgets all of them."""
    try:
        return boom()
    except Exception:
        for i in range(n):
            undo(i)
        raise


@durable.workflow(name="po.cancelled", signals={"go": str})
def cancelled(n: int) -> str:
    """Cancelled at its wait, compensates with ``n`` steps: a resume forgets them."""
    try:
        return str(wf.wait_signal("go"))
    except WorkflowCancelledError:
        for i in range(n):
            undo(i)
        raise


class Killed(BaseException):  # noqa: N818 - a process dying, like SystemExit
    pass


@pytest.fixture(autouse=True)
def _clean() -> None:
    RUNS.clear()


def _snapshot(env: WorkflowEnvironment, pk: str) -> dict[str, Any]:
    return {d["id"]: d for d in env.store.query_partition(pk).docs}


def _long_failed(store: Store | None = None) -> tuple[WorkflowEnvironment, str]:
    env = WorkflowEnvironment(durable, store=store)
    h = env.start(long_, N)
    env.run_until_idle()
    assert h.status() == "failed"
    return env, h.id


def _saga_failed() -> tuple[WorkflowEnvironment, str]:
    env = WorkflowEnvironment(durable)
    h = env.start(saga, N)
    env.run_until_idle()
    assert h.status() == "failed"
    return env, h.id


def _cancelled() -> tuple[WorkflowEnvironment, str]:
    env = WorkflowEnvironment(durable)
    h = env.start(cancelled, N)
    env.run_until_idle()
    env.cancel(h)
    env.run_until_idle()
    assert h.status() == "cancelled"
    return env, h.id


def test_reset_with_a_reason_that_is_not_json_writes_nothing() -> None:
    """The repro adv_reset_bad_reason_half_applied: a bytes ``reason`` raised a raw TypeError after
    the delete batches committed (151 steps -> 2), and the next retry re-ran 148 finished steps."""
    env, eid = _long_failed()
    admin = Admin(env.engine)
    before = _snapshot(env, eid)
    with pytest.raises(OperationRefused, match="reason"):
        admin.reset(eid, step=1, by="ops", reason=b"bytes from a subprocess")  # type: ignore[arg-type]
    assert _snapshot(env, eid) == before
    assert len(admin.describe(eid).steps) == N + 1
    admin.retry(eid)
    env.run_until_idle()
    assert [k for k, c in RUNS.items() if c > 1] == ["boom"]  # only the failed step ran again


BAD: list[tuple[str, Callable[[Admin, str], object]]] = [
    ("reset by bytes", lambda a, e: a.reset(e, 1, by=b"ops")),  # type: ignore[arg-type]
    ("reset by empty", lambda a, e: a.reset(e, 1, by="  ")),
    ("reset reason int", lambda a, e: a.reset(e, 1, by="ops", reason=7)),  # type: ignore[arg-type]
    ("reset reason too long", lambda a, e: a.reset(e, 1, by="ops", reason="x" * 5000)),
    ("reset by too long", lambda a, e: a.reset(e, 1, by="x" * 300)),
    ("reset step str", lambda a, e: a.reset(e, "1", by="ops")),  # type: ignore[arg-type]
    ("reset step bool", lambda a, e: a.reset(e, True, by="ops")),
    ("reset step past the end", lambda a, e: a.reset(e, N + 5, by="ops")),
    ("reset id not a string", lambda a, e: a.reset(7, 1, by="ops")),  # type: ignore[arg-type]
    ("retry id not a string", lambda a, e: a.retry(b"x")),  # type: ignore[arg-type]
    ("retry id empty", lambda a, e: a.retry("")),
    ("resume id not a string", lambda a, e: a.resume(None)),  # type: ignore[arg-type]
    ("purge age str", lambda a, e: a.purge("0")),  # type: ignore[arg-type]
    ("purge age negative", lambda a, e: a.purge(-1)),
    ("purge age nan", lambda a, e: a.purge(float("nan"))),
    ("purge page 0", lambda a, e: a.purge(0, page_size=0)),
    ("purge dry_run str", lambda a, e: a.purge(0, dry_run="no")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("name,call", BAD, ids=[b[0] for b in BAD])
def test_each_bad_input_is_refused_and_writes_nothing(name: str, call: Callable[[Admin, str], object]) -> None:
    env, eid = _long_failed()
    before = _snapshot(env, eid)
    with pytest.raises(OperationRefused):
        call(Admin(env.engine), eid)
    assert _snapshot(env, eid) == before


def test_an_unstorable_document_of_the_plan_is_refused_before_the_first_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the inputs, a document the store would refuse (here an op record holding bytes,
    as a caller's extension could) stops the rewrite before it starts."""
    env, eid = _long_failed()
    before = _snapshot(env, eid)
    from celery_durable.engine.admin import reset as reset_mod

    real = reset_mod.plan_reset

    def plan(*args: Any) -> None:
        real(*args)
        args[1].creates[-1]["extra"] = b"raw"

    monkeypatch.setattr("celery_durable.engine.admin.operator.plan_reset", plan)
    with pytest.raises(OperationRefused, match="cannot be stored"):
        Admin(env.engine).reset(eid, step=1, by="ops")
    assert _snapshot(env, eid) == before


def _stable(docs: dict[str, Any]) -> dict[str, Any]:
    """A partition without what differs between two runs of the same op (etags, clocks, tokens)."""
    volatile = {
        "pk",
        "_etag",
        "_ts",
        "at",
        "generation",
        "last_op",
        PENDING,
        "started",
        "task_id",
        "lease",
        "incarnation",
        "token",  # a marker's delivery token: derived from the (random) execution id (engine/activities/delivery.py)
    }

    def strip(value: Any, drop: set[str]) -> Any:
        if isinstance(value, dict):
            return {k: strip(v, drop) for k, v in value.items() if k not in drop and not k.endswith("_at")}
        return [strip(v, drop) for v in value] if isinstance(value, list) else value

    # an op record's archive holds copies of the steps it forgot, with their clocks (`version`)
    keep = {i: strip(d, volatile | ({"version"} if i.startswith("op:") else set())) for i, d in docs.items()}
    return {i: _unpk(d, str(docs[i]["pk"])) for i, d in keep.items()}


def _unpk(value: Any, pk: str) -> Any:
    """``value`` with the execution's (random) id replaced by a placeholder, wherever it appears."""
    if isinstance(value, dict):
        return {k: _unpk(v, pk) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpk(v, pk) for v in value]
    return value.replace(pk, "<pk>") if isinstance(value, str) else value


@durable.workflow(name="po.fanout")
def fanout(n: int) -> int:
    return sum(wf.gather(*[ok.start(i) for i in range(n)]))


def _fanout_cancelled() -> tuple[WorkflowEnvironment, str]:
    """Cancelled while waiting on ``N`` queued activities: a resume re-arms more markers than
    one batch holds (refused before: "do not fit in one batch"; r1 break)."""
    env = WorkflowEnvironment(durable)
    real = env.dispatcher.handlers["activity"]
    env.dispatcher.handlers["activity"] = lambda req: None  # still queued
    h = env.start(fanout, N)
    env.run_until_idle()
    env.cancel(h)
    env.run_until_idle()
    env.dispatcher.handlers["activity"] = real
    assert h.status() == "cancelled"
    return env, h.id


OPS: list[tuple[str, Callable[[], tuple[WorkflowEnvironment, str]], Callable[[Admin, str], object]]] = [
    ("reset", _long_failed, lambda a, e: a.reset(e, step=20, by="ops", reason="r")),
    ("retry", _saga_failed, lambda a, e: a.retry(e)),
    ("resume", _cancelled, lambda a, e: a.resume(e)),
    ("resume-fan-out", _fanout_cancelled, lambda a, e: a.resume(e)),
]


def test_a_resumed_fan_out_wider_than_a_batch_runs_each_activity_once() -> None:
    env, eid = _fanout_cancelled()
    Admin(env.engine).resume(eid, by="ops")
    env.run_until_idle()
    assert env.result(env.handle(eid)) == sum(range(N))
    assert RUNS == Counter({f"ok{i}": 1 for i in range(N)})


def _target(setup: Callable[[], tuple[WorkflowEnvironment, str]], op: Callable[[Admin, str], object]) -> Any:
    env, eid = setup()
    batches = _count_batches(env)
    op(Admin(env.engine), eid)
    assert batches[0] >= 3, f"the op should span several batches, took {batches[0]}"
    return _stable(_snapshot(env, eid)), batches[0]


def _count_batches(env: WorkflowEnvironment) -> list[int]:
    n = [0]
    real = env.store.batch

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        n[0] += 1
        return real(pk, ops)

    env.store.batch = batch  # type: ignore[method-assign]
    return n


def _die_at(env: WorkflowEnvironment, k: int, after: bool, error: type[BaseException]) -> None:
    """The store's ``k``-th batch from now on dies (before or after it applied); the rest work."""
    n = [0]
    real = env.store.batch

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        n[0] += 1
        if n[0] == k and not after:
            raise error("injected before the batch")
        out = real(pk, ops)
        if n[0] == k:
            raise error("injected after the batch applied")
        return out

    env.store.batch = batch  # type: ignore[method-assign]


TOUCHES = ["admin", "driver", "recovery"]


@pytest.mark.parametrize("touch", TOUCHES)
@pytest.mark.parametrize("error", [Killed, StoreUnavailable], ids=["kill", "store-error"])
@pytest.mark.parametrize("name,setup,op", OPS, ids=[o[0] for o in OPS])
def test_an_op_dying_between_any_two_batches_is_finished_by_the_next_touch(
    name: str,
    setup: Callable[[], tuple[WorkflowEnvironment, str]],
    op: Callable[[Admin, str], object],
    error: type[BaseException],
    touch: str,
) -> None:
    target, batches = _target(setup, op)
    for k in range(1, batches + 1):
        for after in (False, True):
            RUNS.clear()
            env, eid = setup()
            old = _stable(_snapshot(env, eid))
            runs_before = Counter(RUNS)
            _die_at(env, k, after, error)
            with pytest.raises(error):
                op(Admin(env.engine), eid)
            env.store.batch = type(env.store).batch.__get__(env.store)  # type: ignore[method-assign]
            now = _snapshot(env, eid)
            if not isinstance(now["exec"].get(PENDING), dict):
                # nothing recorded: the old history whole, or the op's target whole
                assert _stable(now) in (old, target), (k, after)
                continue
            assert now["exec"]["status"] in ("failed", "cancelled"), "a half-done op never runs"
            if touch == "admin":
                with pytest.raises(OperationRefused):  # it finishes the old op first: now running
                    Admin(env.engine).retry(eid)
            elif touch == "driver":
                env.engine.drive(eid)
            else:
                env.clock.advance(env.engine.settings.drive_timeout + 1)
                env.engine.recovery.scan()
            done = _snapshot(env, eid)
            assert not done["exec"].get(PENDING), (k, after, touch)
            if touch == "driver":
                assert done["exec"]["status"] != "failed"  # it drove on
            else:
                assert _stable(done) == target, (k, after, touch)
            # no finished activity ran again while the op was half done
            assert RUNS == runs_before, (k, after, touch)


@durable.workflow(name="po.waits")
def waits() -> str:
    return str(wf.wait_signal("go"))  # no declared signals: any name is taken


@pytest.mark.parametrize("name", [b"go", 7, "", "x" * 300], ids=["bytes", "int", "empty", "too-long"])
def test_a_signal_with_a_bad_name_is_refused_and_writes_nothing(name: object) -> None:
    """A bytes name raised a raw TypeError; an int, an empty or a 10,000 character name was recorded."""
    env = WorkflowEnvironment(durable)
    h = env.start(waits)
    env.run_until_idle()
    before = _snapshot(env, h.id)
    with pytest.raises(PayloadValidationError):
        env.engine.signal(h.id, name, 1)  # type: ignore[arg-type]
    assert _snapshot(env, h.id) == before


@pytest.mark.parametrize("eid", [b"x", 7, ""], ids=["bytes", "int", "empty"])
def test_a_cancel_of_a_bad_id_is_a_clear_error(eid: object) -> None:
    env = WorkflowEnvironment(durable)
    with pytest.raises(UnknownWorkflowError):
        env.engine.cancel(eid)  # type: ignore[arg-type]


def test_a_reset_killed_between_batches_on_sqlite_is_finished_by_the_recovery_scan(tmp_path: Any) -> None:
    """The same on a real store (SQLite: its batch is a transaction), at every batch."""
    n = 0

    def setup() -> tuple[WorkflowEnvironment, str]:
        nonlocal n
        n += 1
        return _long_failed(SqliteStore(str(tmp_path / f"s{n}.db")))

    def op(a: Admin, e: str) -> object:
        return a.reset(e, step=20, by="ops", reason="r")

    target, batches = _target(setup, op)
    for k in range(1, batches + 1):
        RUNS.clear()
        env, eid = setup()
        runs_before = Counter(RUNS)
        _die_at(env, k, True, Killed)
        with pytest.raises(Killed):
            op(Admin(env.engine), eid)
        env.store.batch = type(env.store).batch.__get__(env.store)  # type: ignore[method-assign]
        env.clock.advance(env.engine.settings.drive_timeout + 1)
        env.engine.recovery.scan()
        done = _snapshot(env, eid)
        assert not done["exec"].get(PENDING) and _stable(done) == target, k
        assert RUNS == runs_before, k
