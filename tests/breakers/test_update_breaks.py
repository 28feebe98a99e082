"""Attacks on workflow updates, signal-/update-with-start and ``activity.publish`` (issue 27 §4:
engine/replay/updates.py, engine/signals/updates.py, engine/starts/with_start.py,
engine/activities/publish.py).

Each test asserts one promise: an update is recorded only when accepted and answered after the
workflow handled it; bad input fails with a clear error in the caller and stores nothing; a
document too large never ends an execution it does not belong to. Tests under "Found by the
breaker (fixed)" failed on the code before their fix (the docstring says what was observed); the
others are attacks that held. The payload limit (``durable_max_payload``) is set to a few KB so
that "too large" costs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery

from celery_durable import (
    ConfigurationError,
    Durable,
    DurableTimeoutError,
    ExecutionEndedError,
    PayloadTooLarge,
    UpdateFailedError,
    UpdateRejectedError,
    activity,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.update_docs import update_request_id
from celery_durable.stores.base import Op, strip_reserved
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment

pytestmark = pytest.mark.adversarial

LIMIT = 4000
app = Celery("update-breaks", set_as_current=False)  # ``celery -A tests.breakers.test_update_breaks``
app.conf.durable_max_payload = LIMIT
durable = Durable(app, store="memory://")


def check_grow(n: int) -> None:
    if n < 0:
        raise ValueError("x" * (2 * LIMIT))  # an error message too long to record


@durable.workflow(name="brk.upd.box")
def box() -> list[Any]:
    seen: list[Any] = []

    @wf.update("grow", validator=check_grow)
    def grow(n: int) -> str:
        seen.append(n)
        return "x" * n

    @wf.update("echo")
    def echo(text: str) -> int:
        seen.append(len(text))
        return len(text)

    wf.set_update_handler("stamp", lambda: {"created_at": 5, "until": 7, "n": [{"at": 1}]})

    def explode() -> None:
        raise RuntimeError("y" * (2 * LIMIT))

    wf.set_update_handler("explode", explode)
    wf.wait_signal("stop")
    return seen


SIZES: list[int] = []


@durable_activity(name="brk.upd.pub")
def pub() -> int:
    for size in SIZES:
        activity.publish("t", "z" * size)
    return len(SIZES)


@durable.workflow(name="brk.upd.pubflow")
def pubflow() -> Any:
    try:
        done: Any = pub()
    except Exception as exc:  # noqa: BLE001 - the activity's failure is the answer here
        done = type(exc).__name__
    wf.wait_signal("stop")
    return done


@durable.workflow(name="brk.upd.waiter")
def waiter(tag: str) -> int:
    return len(wf.wait_signal("go"))


@durable.workflow(name="brk.upd.sender")
def sender(target: str, size: int) -> str:
    try:
        wf.signal_external(target, "go", "q" * size)
    except Exception as exc:  # noqa: BLE001 - how the send failed is the answer
        return type(exc).__name__ + ": " + str(exc)
    return "sent"


async def refuse_all(item: str) -> None:
    raise ValueError("never valid")


class AsyncCheck:
    """An async validator ``inspect.iscoroutinefunction`` does not see as one."""

    async def __call__(self, item: str) -> None:
        raise ValueError("never valid")


@durable.workflow(name="brk.upd.asyncval")
def asyncval(how: str) -> list[str]:
    items: list[str] = []
    if how == "validator":
        wf.set_update_handler("add", lambda item: items.append(item), validator=refuse_all)
    elif how == "callable":
        wf.set_update_handler("add", lambda item: items.append(item), validator=AsyncCheck())
    else:

        async def add(item: str) -> None:
            items.append(item)

        wf.set_update_handler("add", add)
    wf.wait_signal("stop")
    return items


@durable.workflow(name="brk.upd.tally")
def tally() -> list[int]:
    items: list[int] = []
    wf.set_update_handler("add", lambda x: items.append(x) or len(items))
    wf.set_query_handler("items", lambda: list(items))
    done = pub()  # its values are taken in at this wait point too
    wf.wait_signal("stop")
    return [*items, done]


class CutShort(MemoryStore):
    """A store of 10 operations a batch (so a drive deciding many updates overflows: the driver
    creates the first documents alone, then commits the rest in its conditional batch), whose
    armed batch meets a concurrent write of the exec first: it conflicts, after the overflow."""

    max_batch_ops = 10
    armed: str | None = None

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        if self.armed and any(op.doc is not None and op.doc.get("type") == self.armed for op in ops):
            self.armed = None
            ex = self.read(pk, EXEC_ID)
            assert ex is not None
            bumped = strip_reserved(ex) | {"wakeups": int(ex.get("wakeups") or 0) + 1}
            super().batch(pk, [Op.replace(bumped, if_match=ex["_etag"])])  # a signal, another request
        return super().batch(pk, ops)


@durable.workflow(name="brk.upd.twice")
def twice() -> list[Any]:
    got = [wf.wait_signal("go"), wf.wait_signal("go")]
    wf.wait_signal("stop")
    return got


def _env() -> WorkflowEnvironment:
    return WorkflowEnvironment(durable)


# --- Found by the breaker (fixed) --------------------------------------------------------------


def test_an_update_answer_over_the_payload_limit_fails_the_update_not_the_execution() -> None:
    """Broken: a handler returning a value larger than ``durable_max_payload`` made its outcome
    ``updr:<n>`` too large for the drive's commit, and the whole execution failed
    (``PayloadTooLarge: document 'updr:000002'``), the caller getting ``UpdateRefusedError``. So
    did a validator's or a handler's error with a huge message. Now the update fails (or is
    rejected) with ``PayloadTooLarge`` in the caller, and the workflow goes on."""
    env = _env()
    h = env.start(box, _workflow_id="box-1")
    assert env.update(h, "grow", 10) == "x" * 10
    with pytest.raises(UpdateFailedError, match="PayloadTooLarge"):
        env.update(h, "grow", 2 * LIMIT)
    assert h.status() == "running"
    with pytest.raises(UpdateRejectedError, match="PayloadTooLarge"):
        env.update(h, "grow", -1)  # the validator's error, too long to record
    with pytest.raises(UpdateFailedError, match="PayloadTooLarge"):
        env.update(h, "explode")
    assert h.status() == "running" and env.update(h, "echo", "ok") == 2
    env.signal(h, "stop", True)
    assert h.result() == [10, 2 * LIMIT, 2]  # the failed update was applied: its step replays


def test_update_arguments_too_large_for_their_step_are_refused_in_the_caller() -> None:
    """Broken: arguments whose request ``upd:<n>`` just fits the limit were stored, and the
    ``update`` step that copies them (with a few more fields) did not fit: the execution failed
    (``document 's:000002' is 4002 bytes``). Now the caller gets ``PayloadTooLarge`` and nothing
    is stored, by ``update`` and ``update_with_start`` alike."""
    env = _env()
    h = env.start(box, _workflow_id="box-2")
    for size in range(LIMIT - 400, LIMIT, 8):
        try:
            assert env.update(h, "echo", "y" * size) == size
        except PayloadTooLarge:
            pass
        assert h.status() == "running", env.engine.read_exec("box-2").get("error")
    before = {d["id"] for d in env.store.query_partition("box-2").docs}
    with pytest.raises(PayloadTooLarge):
        env.update(h, "echo", "y" * (LIMIT - 150))
    assert {d["id"] for d in env.store.query_partition("box-2").docs} == before
    opts = box.options(workflow_id="box-3")
    with pytest.raises(PayloadTooLarge):
        env.update_with_start(opts, "echo", ["y" * (LIMIT - 150)])
    assert env.store.read("box-3", "exec") is None and env.store.read("box-3", update_request_id(1)) is None


def test_a_published_value_too_large_for_its_step_is_refused_in_the_activity() -> None:
    """Broken: a value whose ``apub:<n>`` just fits the limit was accepted, and the ``publish``
    step that takes it into the stream (with more fields) did not fit: the execution failed
    (``document 's:000002' is 4002 bytes``). Now ``activity.publish`` raises ``PayloadTooLarge``
    in the activity (which fails: its workflow sees the failure, as for a result too large)."""
    for size in range(LIMIT - 400, LIMIT, 8):
        SIZES[:] = [size]
        env = _env()
        h = env.start(pubflow, _workflow_id="pub-1")
        assert h.status() == "running", (size, env.engine.read_exec("pub-1").get("error"))
        env.signal(h, "stop", True)
        assert h.result() in (1, "ActivityError")


def test_an_update_id_that_is_not_a_string_gets_a_clear_error() -> None:
    """Broken: ``handle.update(..., update_id=7)`` raised ``AttributeError: 'int' object has no
    attribute 'encode'`` from the key's digest (``update_with_start`` took the same id as
    ``"7"``). Now both refuse it with a ``TypeError`` that says what an update id is, before
    anything is stored."""
    env = _env()
    h = env.start(box, _workflow_id="box-4")
    with pytest.raises(TypeError, match="update_id"):
        h.update("echo", "a", update_id=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="update_id"):
        env.update_with_start(box.options(workflow_id="box-5"), "echo", ["a"], update_id=7)  # type: ignore[arg-type]
    assert env.store.read("box-4", update_request_id(1)) is None and env.store.read("box-5", "exec") is None


def test_a_signal_value_too_large_for_its_wait_decision_is_refused_in_the_sender() -> None:
    """Broken: a value whose ``sgv:<n>`` just fits the limit was recorded (by
    ``signal_with_start`` or ``signal``), and the wait's decision ``w:<seq>`` that copies it (with
    its step, times and value id) did not fit: the execution failed (``document 'w:000001' is
    4002 bytes``). Now the sender gets ``PayloadTooLarge`` and nothing is stored."""
    for size in range(LIMIT - 400, LIMIT, 8):
        env = _env()
        try:
            env.signal_with_start(waiter.options(workflow_id="sws-1"), "go", "q" * size, "t")
        except PayloadTooLarge:
            assert env.store.read("sws-1", "exec") is None
        else:
            assert env.engine.read_exec("sws-1")["status"] == "completed", size
        h = env.start(waiter, "t", _workflow_id="sig-1")
        try:
            env.signal(h, "go", "q" * size)
        except PayloadTooLarge:
            assert h.status() == "running" and not env.engine.read_exec("sig-1").get("signal_seq")
        else:
            assert h.status() == "completed", size


def test_an_update_timeout_that_is_no_duration_is_refused_before_the_request_is_stored() -> None:
    """Broken: ``handle.update(..., timeout=-1)`` stored the request, then raised
    ``DurableTimeoutError`` at once (the update was applied later, the caller told it was not
    handled); ``timeout=nan`` stored it and never returned (``now >= nan`` is never true). Now
    a timeout that is not a duration >= 0 raises ``ConfigurationError`` (a ``ValueError``, as
    for a start's timeout: ``deadlines.check_seconds``) before anything is stored, from ``update``
    and ``update_with_start`` alike."""
    env = _env()
    h = env.start(box, _workflow_id="box-8")
    for bad in (-1.0, float("nan"), "5"):
        with pytest.raises(ValueError, match="timeout"):
            h.update("echo", "a", timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            box.options(workflow_id="box-9").update_with_start("echo", ["a"], timeout=bad)  # type: ignore[arg-type]
    assert env.store.read("box-8", update_request_id(1)) is None


def test_the_cli_refuses_a_bad_update_name_with_a_clear_error() -> None:
    """Broken: ``durable update ID ""`` (or a name over 256 characters) ended the CLI with a
    ``ValueError`` traceback instead of an error message: only ``DurableError`` was caught."""
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    from celery_durable.stores.memory import MemoryStore
    from tests.apps import basic

    store = MemoryStore()
    basic.durable.configure(store=store)
    try:
        h = WorkflowEnvironment(basic.durable, store=store).start(basic.updatable, 1)
        for name in ("", "n" * 300):
            got = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "update", h.id, name])
            assert got.exit_code == 1 and "1-256 characters" in got.output, (got.output, got.exception)
        got = CliRunner().invoke(
            celery_cli, ["-A", "tests.apps.basic", "durable", "update", h.id, "bump", "--timeout", "-1"]
        )
        assert got.exit_code == 1 and "timeout" in got.output and store.read(h.id, update_request_id(1)) is None
    finally:
        basic.durable.configure(store=None)


def test_signal_with_start_past_the_deadline_says_why_it_was_not_recorded() -> None:
    """Broken: ``signal_with_start`` to an execution past its deadline (its timeout not delivered
    yet: ``signal`` ignores the value) raised ``ExecutionEndedError`` saying "the execution has
    ended (running)". Now the error says it is past its deadline."""
    env = _env()
    opts = waiter.options(workflow_id="late-1", timeout=10)
    h = env.start(opts, "t")
    env.clock.advance(20)  # past the deadline, not driven since
    with pytest.raises(ExecutionEndedError, match="past its deadline") as caught:
        opts.signal_with_start_on(env.engine, "go", "v", ("t",), {})
    assert "(running)" not in str(caught.value)
    env.advance(1)  # its deadline's clock fires
    assert h.status() == "timed_out"


def test_an_async_validator_or_handler_is_refused_not_skipped() -> None:
    """Broken: an ``async def`` validator was called, returned a coroutine (never awaited) and so
    never raised: every update was accepted, the validator bypassed (``refuse_all`` rejects
    everything, yet ``add`` answered). An ``async def`` handler never ran but its update was
    recorded as accepted. Handlers and validators are synchronous (day-two.md): registering a
    coroutine function raises ``TypeError`` in the workflow."""
    env = _env()
    for how in ("validator", "handler"):
        h = env.start(asyncval, how, _workflow_id=f"async-{how}")
        assert h.status() == "failed", how
        error = env.engine.read_exec(f"async-{how}")["error"]
        assert error["type"] == "TypeError" and "async" in error["message"], error
    h = env.start(asyncval, "callable", _workflow_id="async-callable")  # seen when it is called
    with pytest.raises(UpdateRejectedError, match="returned an awaitable"):
        env.update(h, "add", "a")
    env.signal(h, "stop", True)
    assert h.result() == []


def test_the_cli_prints_an_update_answer_as_the_handler_returned_it() -> None:
    """Broken: ``durable update --json`` passed the handler's answer through the timestamp
    rewriting of ``--json`` output, so ``{"created_at": 5, "until": 7}`` printed as ISO dates
    (the answer was not among json_out's user values): a value changed silently."""
    import threading

    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner, Result

    from celery_durable.stores.memory import MemoryStore

    store = MemoryStore()
    durable.configure(store=store)
    try:
        env = WorkflowEnvironment(durable, store=store)
        h = env.start(box, _workflow_id="box-cli")
        got: list[Result] = []
        argv = ["-A", __name__, "durable", "update", h.id, "stamp", "--json"]
        caller = threading.Thread(target=lambda: got.append(CliRunner().invoke(celery_cli, argv)))
        caller.start()
        while caller.is_alive():
            if store.read(h.id, update_request_id(1)) is not None:
                env.engine.dispatcher.send_drive(h.id)
                env.run_until_idle()
            caller.join(timeout=0.01)
        assert got[0].exit_code == 0, got[0].output
        assert json.loads(got[0].output)["answer"] == {"created_at": 5, "until": 7, "n": [{"at": 1}]}
    finally:
        durable.configure(store=None)


def test_updates_and_values_taken_in_a_commit_cut_short_are_applied_once() -> None:
    """Broken: a drive deciding more requests than a batch holds creates the overflow first
    (driver._apply); when its batch then conflicted (a concurrent request or signal), the retry
    found request 4's ``update`` marker (in the overflow) but not its outcome (in the batch):
    the marker was applied again, and the request, looking undecided, was decided again as a
    new step. ``add(3)`` was applied twice (``[0, 1, 2, 3, 3, 4, ...]``, answers 1, 2, 3, 5...).
    So was an activity's published value whose ``publish`` step got in without its ``apubx``
    mark: it entered the stream twice. Now the re-applied step records the missing outcome or
    mark, so it is decided once."""
    store = CutShort()
    env = WorkflowEnvironment(durable, store=store)
    SIZES[:] = []
    h = env.start(tally, _workflow_id="cut-1")
    requests = [env.engine.updates.send("cut-1", "add", (i,)) for i in range(8)]
    store.armed = "update_outcome"
    env.run_until_idle()
    assert [env.engine.updates.outcome("cut-1", n, timeout=0) for n in requests] == list(range(1, 9))
    assert h.query("items") == list(range(8))
    env.signal(h, "stop", True)
    assert h.result() == [*range(8), 0]

    store = CutShort()
    env = WorkflowEnvironment(durable, store=store)
    SIZES[:] = [1] * 8
    store.armed = "publication_mark"
    h = env.start(tally, _workflow_id="cut-2")
    env.signal(h, "stop", True)
    assert h.result() == [8] and list(h.stream("t")) == ["z"] * 8


def test_a_signal_consumed_in_a_commit_cut_short_is_not_lost() -> None:
    """Broken (signal_with_start's "never a signal lost"): a drive consuming a value records its
    mark (``sgc:<n>``) before the wait's decision (``w:<seq>``); when its commit overflowed
    a batch right between them (the overflow is created first: driver._apply) and the batch then
    conflicted, the retry found the value settled but the wait undecided: it skipped the value
    and waited for the next one. Value "A" was lost, the workflow waited forever for a second
    "go". Now a wait finds the value its cut-short commit consumed."""
    for limit in (2, 3, 4):
        store = CutShort()
        store.max_batch_ops = limit
        env = WorkflowEnvironment(durable, store=store)
        h = twice.options(workflow_id="cut-sig").signal_with_start_on(env.engine, "go", "A", (), {})
        store.armed = "signal"  # the first drive consumes "A": its commit is cut short
        env.run_until_idle()
        env.signal(h, "go", "B")
        env.signal(h, "stop", True)
        assert h.status() == "completed", limit
        assert h.result() == ["A", "B"]


# --- Attacks that held -------------------------------------------------------------------------


def test_held_an_update_id_reused_gets_the_first_requests_answer_once() -> None:
    """Resending with the same ``update_id`` (even other arguments) finds the first request: one
    step, the first answer (Temporal's rule: the id names the request)."""
    env = _env()
    h = env.start(box, _workflow_id="box-6")
    assert env.update(h, "echo", "abc", update_id="u") == 3
    assert env.update(h, "echo", "abcdef", update_id="u") == 3
    env.signal(h, "stop", True)
    assert h.result() == [3]


def test_held_bad_arguments_fail_in_the_caller_and_store_nothing() -> None:
    env = _env()
    h = env.start(box, _workflow_id="box-7")
    before = {d["id"]: d.get("_etag") for d in env.store.query_partition("box-7").docs}
    with pytest.raises(Exception, match="nan"):
        h.update("echo", float("nan"))
    with pytest.raises(ValueError, match="1-256 characters"):
        h.update("e" * 300)
    assert {d["id"]: d.get("_etag") for d in env.store.query_partition("box-7").docs} == before


def test_held_a_signal_external_too_large_fails_its_sender_never_the_receiver() -> None:
    """The sending step's own marker holds the value and more than the receiver's wait decision:
    a value too large fails the sender's commit (its own step, as any step's arguments), never
    the receiver."""
    for size in range(LIMIT - 300, LIMIT - 200, 4):
        env = _env()
        target = env.start(waiter, "t", _workflow_id="ext-target")
        h = env.start(sender, "ext-target", size, _workflow_id="ext-sender")
        env.run_until_idle()
        assert target.status() in ("running", "completed") and h.status() in ("completed", "failed")
        assert (target.status() == "completed") == (h.status() == "completed"), size


def test_held_with_start_on_another_workflows_id_is_refused_and_stores_nothing() -> None:
    env = _env()
    env.start(waiter, "t", _workflow_id="other-1")
    before = {d["id"]: d.get("_etag") for d in env.store.query_partition("other-1").docs}
    with pytest.raises(ConfigurationError, match="runs workflow 'brk.upd.waiter'"):
        env.update_with_start(box.options(workflow_id="other-1"), "echo", ["a"])
    with pytest.raises(ConfigurationError, match="runs workflow 'brk.upd.waiter'"):
        env.signal_with_start(box.options(workflow_id="other-1"), "go", "v")
    assert {d["id"]: d.get("_etag") for d in env.store.query_partition("other-1").docs} == before


def test_held_an_update_to_a_paused_execution_waits_and_is_applied_once_after() -> None:
    from celery_durable.engine.admin.pause import pause, unpause

    env = _env()
    h = env.start(box, _workflow_id="box-paused")
    assert pause(env.engine, "box-paused", "test")
    n = env.engine.updates.send("box-paused", "echo", ("abc",))
    env.run_until_idle()
    env.advance(120)
    with pytest.raises(DurableTimeoutError):
        env.engine.updates.outcome("box-paused", n, timeout=0)
    assert unpause(env.engine, "box-paused", "test")
    env.run_until_idle()
    assert env.engine.updates.outcome("box-paused", n, timeout=0) == 3
    env.signal(h, "stop", True)
    assert h.result() == [3]
