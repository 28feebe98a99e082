"""Attacks on batch operations (issue 27 §2: engine/admin/batch.py, glue/batch.py).

Promises: every execution the query selects is acted on exactly once per page pass (none skipped,
none acted on twice in a way that changes something), refusals never stop it, a killed worker
costs at most one page acted on again and every action is safe to repeat, specs are checked in the
caller, it is rate limited and reports its progress. Tests named ``test_held_*`` are attacks that
held (keyset pagination on memory, SQLite and PostgreSQL with equal ``created_at``, the action
moving executions out of the status filter, executions started meanwhile, search filters; a
signal page redelivered after a killed worker). The others fail on 39af45c: each docstring says
what should happen. A killed worker is simulated by a BaseException out of the page (the attempt
never ends) and the broker's redelivery of its message after the lease lapses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin import batch as batch_engine
from celery_durable.engine.admin.batch import BATCH_WORKFLOW, batch_spec
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.errors import DurableTimeoutError, StoreUnavailable
from celery_durable.stores import Store, store_from_url
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.plugins.postgres import _postgres_server, postgres_schema, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.adversarial

durable = Durable(Celery("batch-breaks", set_as_current=False), store="memory://")
charged: list[str] = []


@durable.workflow(name="bb.counts")
def counts(tag: str) -> list[Any]:
    """Takes every "go" signal within an hour of the first: a duplicate shows as a second value."""
    got = [wf.wait_signal("go")]
    while True:
        try:
            got.append(wf.wait_signal("go", timeout=3600))
        except DurableTimeoutError:
            return got


@durable_activity(name="bb.charge")
def charge(tag: str) -> str:
    charged.append(tag)
    raise NonRetryableError("card declined")


@durable.workflow(name="bb.pays")
def pays(tag: str) -> str:
    return charge(tag)


class Killed(BaseException):  # noqa: N818 - a worker process dying mid-page
    pass


def _start_batch(env: WorkflowEnvironment, action: str, **spec: Any) -> str:
    query, options = batch_spec(action, by="ops", **spec)
    definition = env.engine.registry.workflow(BATCH_WORKFLOW)
    assert definition is not None
    eid, _ = env.engine.start(definition, (action, query, options), {})
    return eid


def _finish(env: WorkflowEnvironment, eid: str) -> dict[str, Any]:
    env.run_until_idle()
    for _ in range(500):
        if env.engine.read_exec(eid)["status"] != "running":
            break
        if not env.skip_to_next_timer():
            break
    return env.engine.read_exec(eid)


def _kill_on(monkeypatch: pytest.MonkeyPatch, env: WorkflowEnvironment, nth: int) -> list[ActivityRequest]:
    """The worker running a page dies at its ``nth`` action; the page messages delivered."""
    sent: list[ActivityRequest] = []
    deliver = env.dispatcher.handlers["activity"]

    def recording(req: ActivityRequest) -> None:
        if req.name == "celery_durable.batch.page":
            sent.append(req)
        deliver(req)

    env.dispatcher.handlers["activity"] = recording
    real = batch_engine._act
    calls = {"n": 0}

    def dying(*args: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == nth:
            raise Killed
        return real(*args)

    monkeypatch.setattr(batch_engine, "_act", dying)
    return sent


def _redeliver(env: WorkflowEnvironment, sent: list[ActivityRequest]) -> None:
    env.clock.advance(31)  # the killed attempt's lease lapses (lease_ttl 30 s)
    env.dispatcher.send_activity(sent[-1])  # acks_late: the broker redelivers the page's message


# --- held ---------------------------------------------------------------------------------------


def test_held_a_page_redelivered_after_a_killed_worker_signals_nobody_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    env = WorkflowEnvironment(durable)
    for i in range(4):
        env.start(counts, f"c{i}", _workflow_id=f"c{i}")
    sent = _kill_on(monkeypatch, env, 3)
    eid = _start_batch(env, "signal", workflow="bb.counts", signal="go", value="v", page_size=10)
    with pytest.raises(Killed):
        env.run_until_idle()
    _redeliver(env, sent)
    ex = _finish(env, eid)
    assert ex["status"] == "completed", ex
    env.advance(3601)
    assert {f"c{i}": env.engine.read_exec(f"c{i}")["result"] for i in range(4)} == {f"c{i}": ["v"] for i in range(4)}


# --- breaks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["retry", "reset"])
def test_a_page_redelivered_after_a_killed_worker_retries_no_execution_twice(
    monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """``durable batch retry --status failed``: a worker killed mid-page costs the page acted on
    again, and "a second retry is refused: it runs already". But an execution the killed attempt
    retried that failed again before the redelivery (its step failing in milliseconds, the lease
    lapsing after 30 s) is failed again: the page retries (resets) it a second time and its step
    (a card charge) runs once more than the one retry the operator asked for."""
    charged.clear()
    env = WorkflowEnvironment(durable)
    for i in range(3):
        env.start(pays, f"p{i}", _workflow_id=f"p{i}")
    env.run_until_idle()
    assert sorted(charged) == ["p0", "p1", "p2"] and {env.engine.read_exec(f"p{i}")["status"] for i in range(3)} == {
        "failed"
    }
    charged.clear()
    sent = _kill_on(monkeypatch, env, 3)  # p2 and p1 retried (newest first), killed before p0
    eid = _start_batch(env, action, workflow="bb.pays", status="failed", step=1, page_size=10)
    with pytest.raises(Killed):
        env.run_until_idle()
    env.run_until_idle()  # the retried executions run on other workers meanwhile: they fail again
    _redeliver(env, sent)
    ex = _finish(env, eid)
    assert ex["status"] == "completed", ex
    assert sorted(charged) == ["p0", "p1", "p2"], charged  # one retry each


class _Flaky(MemoryStore):
    """A store whose next write to one partition fails as a database blip (Cosmos 429, a
    PostgreSQL connection reset): StoreUnavailable, "the operation may be retried"."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_on: str | None = None

    def batch(self, pk: str, ops: Any) -> Any:
        if pk == self.fail_on:
            self.fail_on = None
            raise StoreUnavailable("connection reset by peer")
        return super().batch(pk, ops)


def test_a_store_blip_while_acting_skips_no_execution() -> None:
    """A transient store error (StoreUnavailable: "may be retried"; Throttled, Cosmos' 429) while
    acting on one execution is no refusal: the page must be acted on again (every action is safe
    to repeat) or the action retried, never the execution left out. Today it is counted as a
    refusal and the batch completes with that execution still running."""
    store = _Flaky()
    env = WorkflowEnvironment(durable, store=store)
    for i in range(3):
        env.start(counts, f"c{i}", _workflow_id=f"c{i}")
    env.run_until_idle()
    store.fail_on = "c1"
    eid = _start_batch(env, "cancel", workflow="bb.counts", status="running", page_size=10)
    ex = _finish(env, eid)
    assert ex["status"] == "completed", ex
    assert [env.engine.read_exec(f"c{i}")["status"] for i in range(3)] == ["cancelled"] * 3, ex["result"]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    s = store_from_url(url)
    yield s
    s.close()


@pytest.mark.parametrize("action,status", [("cancel", "running"), ("pause", "running"), ("retry", "failed")])
@pytest.mark.parametrize("searched", [False, True])
def test_held_every_matching_execution_is_acted_on_once_while_the_action_moves_it_out_of_the_selection(
    any_store: Store, action: str, status: str, searched: bool
) -> None:
    """Equal created_at (a fake clock that does not move), the action taking each execution out of
    the status filter, executions started while the batch runs: none skipped, none acted on twice."""
    charged.clear()
    env = WorkflowEnvironment(durable, store=any_store)
    wfn = pays if status == "failed" else counts
    for i in range(11):
        env.start(wfn.options(search={"k": "a" if i % 4 else "b"}), f"x{i}", _workflow_id=f"x{i:02d}")
    env.run_until_idle()
    acted: list[str] = []
    real = batch_engine._act

    def spy(engine: Any, admin: Any, act: str, eid: str, *rest: Any) -> bool:
        acted.append(eid)
        if len(acted) % 3 == 0:  # a new execution, started while the batch runs (same created_at)
            env.engine.create_execution(
                wfn.name, {"args": [f"new{len(acted)}"], "kwargs": {}}, f"new{len(acted)}", None
            )
        return real(engine, admin, act, eid, *rest)

    mp = pytest.MonkeyPatch()
    mp.setattr(batch_engine, "_act", spy)
    try:
        search = {"k": "a"} if searched else None
        eid = _start_batch(env, action, workflow=wfn.name, status=status, search=search, page_size=3)
        ex = _finish(env, eid)
    finally:
        mp.undo()
    want = [f"x{i:02d}" for i in range(11) if not searched or i % 4]
    old = [a for a in acted if a.startswith("x")]
    assert sorted(old) == want and len(old) == len(set(old)), acted
    assert ex["status"] == "completed" and ex["result"]["done"] == len(acted), ex


def test_totals_after_a_killed_worker_count_the_batchs_own_actions_as_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a killed worker the page is acted on again: the executions the killed attempt
    cancelled are found cancelled already. They were cancelled by this batch, so the totals must
    say done=4, refused=0 — today they say refused=2 ("nothing to do (already so)"), a progress
    report naming refusals for work the batch did (`durable batch --wait` shows it)."""
    env = WorkflowEnvironment(durable)
    for i in range(4):
        env.start(counts, f"c{i}", _workflow_id=f"c{i}")
    env.run_until_idle()
    sent = _kill_on(monkeypatch, env, 3)
    eid = _start_batch(env, "cancel", workflow="bb.counts", page_size=10)
    with pytest.raises(Killed):
        env.run_until_idle()
    _redeliver(env, sent)
    ex = _finish(env, eid)
    assert [env.engine.read_exec(f"c{i}")["status"] for i in range(4)] == ["cancelled"] * 4
    result = ex["result"]
    assert (result["matched"], result["done"], result["refused"]) == (4, 4, 0), result


def test_rate_keeps_to_n_executions_in_every_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rate N``: "at most this many executions per second" (CLI help; docs: "keeps it to N
    executions per second"). The sleep comes only between pages, so with the default page size
    (100) a batch at rate 2 acts on all 10 executions in the same instant: 10 in one second."""
    env = WorkflowEnvironment(durable)
    for i in range(10):
        env.start(counts, f"c{i}", _workflow_id=f"c{i}")
    env.run_until_idle()
    at: list[float] = []
    real = batch_engine._act

    def timed(*args: Any) -> bool:
        at.append(env.clock.now())
        return real(*args)

    monkeypatch.setattr(batch_engine, "_act", timed)
    eid = _start_batch(env, "pause", workflow="bb.counts", rate=2.0)
    assert _finish(env, eid)["status"] == "completed"
    assert len(at) == 10
    busiest = max(sum(1 for t in at if s <= t < s + 1.0) for s in at)
    assert busiest <= 2, f"{busiest} executions acted on within one second at rate 2"


@pytest.mark.parametrize(
    "action,spec",
    [
        ("cancel", {"reason": "x" * 5000}),  # over MAX_REASON (4096)
        ("cancel", {"by": "   "}),  # a blank operator name
        ("signal", {"signal": "s" * 300}),  # a signal name over MAX_BY (256)
    ],
)
def test_a_spec_every_execution_would_refuse_fails_in_the_caller(action: str, spec: dict[str, Any]) -> None:
    """ "Specs are checked in the caller" (ConfigurationError before anything starts), as ``durable
    cancel --reason`` refuses a reason over 4096 characters. Today the batch starts and then each
    execution refuses it (OperationRefused / PayloadValidationError): a batch that completes having
    done nothing, N refusals, instead of an error at the prompt."""
    from celery_durable.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        durable.batch(action, workflow="bb.counts", **spec)


def test_one_malformed_execution_does_not_stop_the_batch() -> None:
    """ "Refusals never stop it": an execution its action cannot handle is counted and named. An
    exec document whose ``wakeups`` is not a number (valid JSON, written by an older version or a
    hand edit) makes ``cancel`` raise a ValueError, which is no DurableError: the page activity
    fails at once (autoretry only for DurableError), the batch fails, and the other executions of
    that page and every later page are never cancelled (a retry of the batch fails the same way).
    The UI's batch counts a ValueError as that execution's refusal (ui/app.py ``batch``)."""
    from celery_durable.stores.base import Op

    env = WorkflowEnvironment(durable)
    for i in range(4):
        env.start(counts, f"c{i}", _workflow_id=f"c{i}")
    env.run_until_idle()
    ex = env.engine.store.read("c3", "exec")
    assert ex is not None
    env.engine.store.batch(
        "c3",
        [Op.replace({k: v for k, v in ex.items() if not k.startswith("_")} | {"wakeups": "x"}, if_match=ex["_etag"])],
    )
    eid = _start_batch(env, "cancel", workflow="bb.counts", page_size=2)
    done = _finish(env, eid)
    assert done["status"] == "completed", done.get("error")
    assert [env.engine.read_exec(f"c{i}")["status"] for i in range(3)] == ["cancelled"] * 3
    assert done["result"]["refused"] == 1 and done["result"]["errors"][0][0] == "c3"
