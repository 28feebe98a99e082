"""Adversarial tests of the replay check (``durable replay-check``, ``celery_durable.testing.replay``,
engine/replay/check.py): wrong verdicts, and a check that one execution can abort or fake."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_durable import workflow as wf
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.registry import Registry
from celery_durable.engine.replay.check import ReplayVerdict, Verdict, check_history, export_history
from celery_durable.engine.replay.context import require_context
from celery_durable.engine.replay.futures import DurableFuture
from celery_durable.settings import Settings
from celery_durable.stores import store_from_url
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.testing.replay import replay
from tests.apps import rcb_app
from tests.engine.inprocess import InProcess

ACTIVITIES = ("a", "b", "c")


def _activities(reg: Registry) -> None:
    for name in ACTIVITIES:

        def fn(x: int, name: str = name) -> str:
            return f"{name}{x}"

        reg.add_activity(name, fn)


def _start(name: str, x: int) -> DurableFuture[Any]:
    ctx = require_context("test")
    act = ctx.registry.activity(name)
    assert act is not None
    return ctx.call_activity(name, act.codec, (x,), {})


def _call(name: str, x: int) -> Any:
    return _start(name, x).result()


def _world(name: str, fn: Callable[..., Any]) -> InProcess:
    w = InProcess()
    _activities(w.registry)
    w.registry.add_workflow(name, fn)
    return w


def _deploy(name: str, fn: Callable[..., Any]) -> Registry:
    """The next deploy's code: the same activities, ``fn`` as workflow ``name``."""
    reg = Registry()
    _activities(reg)
    reg.add_workflow(name, fn)
    return reg


def _check(w: InProcess, eid: str, reg: Registry) -> ReplayVerdict:
    docs = {d["id"]: d for d in w.store.query_partition(eid).docs}
    return check_history(docs, reg, Settings(), w.clock.now())


def _drives_only(w: InProcess) -> list[ActivityRequest]:
    """Run the queued drives; keep the activity messages (those activities are still running)."""
    held = []
    while w.dispatcher.queue:
        kind, item = w.dispatcher.queue.popleft()
        if kind == "drive":
            w.engine.drive(str(item))
        else:
            held.append(item)
    return held


# --- false compatibles -----------------------------------------------------------------------


def test_code_suspending_before_the_recorded_steps_end_is_not_reported_compatible() -> None:
    """A running execution recorded two activities started together (steps 1 and 2, both still
    running). The new code awaits step 1 first and then calls ``c`` at step 2: the history has
    ``b`` there. The check replays up to step 1 (pending), sees the code suspend after 1 step while
    2 are recorded, and must not call it compatible: the drive that follows step 1's completion
    fails the execution with NonDeterminismError at step 2 (shown below with the real engine).
    The queries' replay already treats ``steps < recorded`` as a history the code does not fit."""

    def parallel(x: int) -> str:
        fa, fb = _start("a", x), _start("b", x)
        return str(fa.result()) + str(fb.result())

    w = _world("par", parallel)
    w.engine.start(w.registry.workflows["par"], (1,), {}, workflow_id="p1")
    held = _drives_only(w)
    assert w.status("p1") == "running" and w.ex("p1")["steps"] == 2

    def sequential(x: int) -> str:  # the deploy: one after the other, and c instead of b
        return str(_call("a", x)) + str(_call("c", x))

    new = _deploy("par", sequential)
    verdict = _check(w, "p1", new)
    # the real engine with the new code: step 1 completes, the next drive fails the execution
    w2 = InProcess(store=w.store, registry=new, clock=w.clock)
    for req in held:
        if req.name == "a":
            w2.worker._activity(req)
    w2.run()
    assert w2.status("p1") == "failed" and w2.ex("p1")["error"]["type"] == "NonDeterminismError"
    assert verdict.verdict == Verdict.INCOMPATIBLE, verdict


def _completed_world() -> InProcess:
    def order(x: int) -> str:
        first = _call("a", x)
        wf.wait_signal("go")
        return str(first) + str(_call("b", x))

    w = _world("order", order)
    w.engine.start(w.registry.workflows["order"], (1,), {}, workflow_id="o1")
    w.run()
    w.engine.signal("o1", "go", 1)
    w.run()
    assert w.status("o1") == "completed" and w.ex("o1")["steps"] == 3
    return w


def test_an_ended_execution_whose_new_code_raises_is_not_compatible() -> None:
    """A completed execution (3 steps) replayed by code that now raises after step 1 takes a
    different number of steps than the history: the promise is "incompatible" (or at least not
    compatible). The same code against a *running* execution is reported ``fails``; for an ended
    one the check falls through to ``compatible`` (check.py: FAILS only when not terminal). This
    is the pytest helper's documented use: completed histories exported and kept with the tests."""
    w = _completed_world()

    def broken(x: int) -> str:
        _call("a", x)
        raise RuntimeError("a bug in the new code")

    verdict = _check(w, "o1", _deploy("order", broken))
    assert not verdict.ok, verdict


def test_an_ended_execution_whose_activity_result_no_longer_decodes_is_not_compatible() -> None:
    """The deploy changes activity ``a``'s return type (str -> int): every recorded result of
    ``a`` fails to decode on replay (PayloadValidationError). The check must not pass a completed
    history that the new code cannot even replay."""
    w = _completed_world()

    def order(x: int) -> str:
        first = _call("a", x)
        wf.wait_signal("go")
        return str(first) + str(_call("b", x))

    new = Registry()
    _activities(new)

    def a(x: int) -> int:
        return x

    new.add_activity("a", a)  # a now returns an int
    new.add_workflow("order", order)
    verdict = _check(w, "o1", new)
    assert not verdict.ok, verdict


def test_an_ended_execution_of_no_steps_given_a_side_effect_is_incompatible() -> None:
    """An execution that completed without any step, replayed by code that now records a side
    effect (``wf.now()``), takes 1 step where the history has 0: an ended execution given a step
    it never took is incompatible (it is, with 1 step recorded: check.py's ``recorded and
    invented`` exempts histories of 0 steps)."""

    def pure(x: int) -> int:
        return x

    w = _world("pure", pure)
    w.start(w.registry.workflows["pure"], 1, wid="z1")
    assert w.status("z1") == "completed"

    def stamped(x: int) -> int:
        wf.now()
        return x

    verdict = _check(w, "z1", _deploy("pure", stamped))
    assert verdict.verdict == Verdict.INCOMPATIBLE and verdict.step == 1, verdict


def test_a_corrupt_step_of_an_ended_execution_is_unreadable() -> None:
    """The same corrupt marker (``seq`` not a number) that makes a running execution
    ``unreadable`` is passed over in a completed one (check_partition checks only the exec of an
    ended execution), and its verdict is ``compatible``: it should be ``unreadable``."""
    w = _completed_world()
    docs = {d["id"]: d for d in w.store.query_partition("o1").docs}
    docs["s:000002"] = dict(docs["s:000002"], seq="not a number")
    verdict = check_history(docs, w.registry, Settings(), w.clock.now())
    assert verdict.verdict == Verdict.UNREADABLE, verdict


# --- false incompatibles ---------------------------------------------------------------------


def test_a_terminated_execution_with_unchanged_code_is_compatible() -> None:
    """``durable terminate`` ends a running execution as ``failed`` while it waits at step 2.
    Replaying it with the very code that recorded it suspends at step 2, as it did; the check
    calls it incompatible ("the code takes step 3, which this failed execution never took", code
    "more steps" — the code takes no step 3), so ``replay-check --status any`` fails every deploy
    once any execution was ever terminated."""
    w = _completed_world()
    w.engine.start(w.registry.workflows["order"], (2,), {}, workflow_id="t1")
    w.run()
    assert terminate(w.engine, "t1", "ops", "stuck")
    assert w.status("t1") == "failed"
    verdict = _check(w, "t1", w.registry)
    assert verdict.ok, verdict


# --- a check that one execution can abort or fake ----------------------------------------------


@pytest.fixture
def recorded() -> Any:
    """One running execution of each of rcb.ok, rcb.exit and rcb.base recorded by the old code;
    the new code's app pointed at the same store."""
    store = MemoryStore()
    env = WorkflowEnvironment(rcb_app.old, store=store)
    for i, name in enumerate(("rcb.ok", "rcb.exit", "rcb.base")):
        env.start(rcb_app.OLD[name], i, _workflow_id=name)
    rcb_app.durable.configure(store=store)
    yield store
    rcb_app.durable.configure(store=None)


def test_workflow_code_calling_sys_exit_does_not_make_the_check_pass(recorded: Any) -> None:
    """New code that calls ``sys.exit(0)`` during replay (a bug, or a library doing it) escapes
    the check as SystemExit: ``replay-check`` prints nothing and exits 0, as if every execution
    were compatible. It should report that execution as ``fails`` and exit 1."""
    out = CliRunner().invoke(
        celery_cli, ["-A", "tests.apps.rcb_app", "durable", "replay-check", "--workflow", "rcb.exit"]
    )
    assert out.exit_code == 1 and "fails" in out.output, (out.exit_code, out.output)


def test_one_workflow_raising_a_base_exception_does_not_abort_the_whole_check(recorded: Any) -> None:
    """New code raising a BaseException that is not an Exception (``Interrupted``) escapes
    check_all: no verdict at all is returned, for any execution. The other executions should be
    checked and this one reported (``fails``)."""
    histories = [
        export_history({d["id"]: d for d in recorded.query_partition(eid).docs}) for eid in ("rcb.base", "rcb.ok")
    ]
    try:
        verdicts = replay(rcb_app.durable, histories, raise_on_mismatch=False)
    except BaseException as exc:  # noqa: BLE001 - the bug: it escapes
        pytest.fail(f"the check was aborted by one execution's code: {exc!r}")
    by_id = {v.execution_id: v.verdict for v in verdicts}
    assert by_id["rcb.base"] == Verdict.FAILS and by_id["rcb.ok"] == Verdict.COMPATIBLE


def test_a_corrupt_row_makes_its_execution_unreadable_not_the_whole_check_fail(tmp_path: Path) -> None:
    """On SQLite a document that is not valid JSON makes ``query_partition`` raise
    CorruptDocument; check_all lets it escape, so ``replay-check`` stops with that error and checks
    no other execution, and the pytest helper raises it instead of returning verdicts. The
    promised verdict for a corrupt document is ``unreadable``, per execution."""
    url = f"sqlite:///{tmp_path}/h.db"
    store = store_from_url(url)
    env = WorkflowEnvironment(rcb_app.old, store=store)
    env.start(rcb_app.OLD["rcb.ok"], 1, _workflow_id="good")
    env.start(rcb_app.OLD["rcb.ok"], 2, _workflow_id="bad")
    con = sqlite3.connect(f"{tmp_path}/h.db")
    con.execute("UPDATE docs SET body = '{not json' WHERE pk = 'bad' AND id = 's:000001'")
    con.commit()
    con.close()
    rcb_app.durable.configure(store=store)
    try:
        try:
            verdicts = replay(rcb_app.durable, workflow="rcb.ok", raise_on_mismatch=False)
        except Exception as exc:  # noqa: BLE001 - the bug: it escapes
            pytest.fail(f"the check was aborted by one corrupt execution: {exc!r}")
        by_id = {v.execution_id: v.verdict for v in verdicts}
        assert by_id == {"good": Verdict.COMPATIBLE, "bad": Verdict.UNREADABLE}
    finally:
        rcb_app.durable.configure(store=None)
