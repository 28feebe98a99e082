"""Attacks on two features: a Celery canvas run durably (``durable.run(sig)``, glue/canvas.py,
42c1fb7) and ``@durable_activity(pause_on_failure=True)`` (engine/activities/holds.py, 5d2349c).

Each docstring says what should happen. All failed on the code they were written against
(42c1fb7 + 5d2349c) except four attacks that held, kept as regressions:
test_unpause_after_a_cancel_does_not_run_the_held_step_again,
test_unpause_before_the_fix_pauses_again, test_a_held_step_gives_its_limit_slot_back,
test_a_failure_while_an_operator_paused_it_is_held_and_unpause_reruns_it. They run on
``WorkflowEnvironment`` (memory store, fake clock, inline dispatcher).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from celery import Celery, chain, chord

from celery_durable import Durable, Limit, durable_activity
from celery_durable.errors import ConfigurationError, WorkflowFailedError
from celery_durable.glue.canvas import CANVAS_WORKFLOW, check_canvas
from celery_durable.testing.env import WorkflowEnvironment

pytestmark = pytest.mark.adversarial

app = Celery("cpb-tests", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
CALLS: list[Any] = []


@durable_activity(name="cpb.add")
def add(x: int, y: int) -> int:
    CALLS.append(("add", x, y))
    return x + y


@durable_activity(name="cpb.xsum")
def xsum(numbers: list[int]) -> int:
    CALLS.append(("xsum", list(numbers)))
    return sum(numbers)


@durable_activity(name="cpb.fail")
def fail(*args: Any) -> None:
    CALLS.append(("fail", args))
    raise ValueError(f"failed with {args}")


@durable_activity(name="cpb.note")
def note(*what: Any) -> Any:
    CALLS.append(("note", *what))
    return list(what)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    CALLS.clear()
    yield


def _run(sig: Any) -> Any:
    """Run ``sig`` as ``durable.run`` does, on a WorkflowEnvironment: the result, or
    WorkflowFailedError."""
    env = WorkflowEnvironment(durable)
    definition = env.engine.registry.workflow(CANVAS_WORKFLOW)
    assert definition is not None
    eid, _ = env.engine.start(definition, (check_canvas(sig, env.engine.registry),), {})
    env.run_until_idle()
    ex = env.engine.read_exec(eid)
    if ex["status"] != "completed":
        err = ex.get("error") or {}
        raise WorkflowFailedError(eid, str(err.get("type")), str(err.get("message")))
    return ex["result"]


# --- canvas ----------------------------------------------------------------------------------


def test_link_on_a_chain_runs_with_the_chains_result() -> None:
    """Celery 5.7 keeps ``chain.link(cb)`` in the chain's own options and applies it to the
    chain's last task: ``cb`` runs once, with the chain's result. Durably it must run too."""
    c = chain(add.s(1, 1), add.s(10))
    c.link(note.s("after"))
    assert _run(c) == 12
    assert ("note", 12, "after") in CALLS


def test_link_error_on_a_chain_runs_when_a_task_fails() -> None:
    """``chain.link_error(eb)`` (kept in the chain's options; Celery links it to every task):
    a failing task runs ``eb``, then the chain fails."""
    c = chain(add.s(1, 1), fail.s())
    c.link_error(note.si("compensated"))
    with pytest.raises(WorkflowFailedError, match="ValueError"):
        _run(c)
    assert ("note", "compensated") in CALLS


def test_link_error_on_a_chord_runs_when_its_header_fails() -> None:
    """``chord.link_error(eb)`` links ``eb`` to the body (Celery's default); when a header task
    fails Celery calls the body's errbacks (chord_error_from_stack). Durably it must run too."""
    c = chord([add.s(1, 1), fail.s()], xsum.s())
    with warnings.catch_warnings():  # Celery's pending deprecation of the body-only default
        warnings.simplefilter("ignore")
        c.link_error(note.si("chord failed"))
    with pytest.raises(WorkflowFailedError, match="ValueError"):
        _run(c)
    assert ("note", "chord failed") in CALLS


def test_a_failing_link_callback_does_not_fail_the_chain() -> None:
    """A ``link`` callback is a separate task in Celery: its failure does not change the linked
    task's result nor stop the chain (chain(add(1,1) [link: fail], add(1)) gives 3)."""
    first = add.s(1, 1)
    first.link(fail.si())
    assert _run(chain(first, add.s(1))) == 3


def test_a_failing_errback_keeps_the_original_failure() -> None:
    """An errback that fails itself must not replace the task's own failure (Celery: the task
    stays FAILURE with its own exception)."""
    failing = fail.s("original")
    failing.link_error(fail.si("errback"))  # the errback fails too
    with pytest.raises(WorkflowFailedError) as info:
        _run(chain(add.s(1, 1), failing))
    assert "original" in str(info.value) and "errback" not in str(info.value)


def test_an_empty_chain_does_not_leak_the_internal_sentinel() -> None:
    """Celery's ``chain().apply()`` gives None; the canvas's ``no previous result`` marker is
    internal and must never be an execution's result."""
    assert _run(chain()) is None


def test_a_single_link_signature_is_checked_or_refused_clearly() -> None:
    """``sig.set(link=cb)`` (one signature, not a list: Celery's apply_async takes either) must
    run ``cb`` or be refused with a ConfigurationError — not crash check_canvas with an
    AttributeError on the signature's keys."""
    sig = add.s(1, 1).set(link=note.si("linked"))
    try:
        out = _run(sig)
    except ConfigurationError:
        return
    assert out == 2 and ("note", "linked") in CALLS


def test_a_chord_without_a_body_is_refused_clearly() -> None:
    """``chord(header)`` without a body is not runnable: refused at run() with a
    ConfigurationError, not an AttributeError/KeyError from inside check_canvas."""
    with pytest.raises(ConfigurationError):
        check_canvas(chord([add.s(1, 1)]), durable.registry)


# --- pause on failure ------------------------------------------------------------------------

BROKEN = {"on": True}
CHARGES: list[int] = []


@durable_activity(name="cpb.charge", pause_on_failure=True)
def charge(cents: int) -> str:
    CHARGES.append(cents)
    if BROKEN["on"]:
        raise ConnectionRefusedError("the payment service is down")
    return f"charged {cents}"


class _Unencodable:
    pass


@durable_activity(name="cpb.unencodable", pause_on_failure=True)
def unencodable(x: int) -> Any:
    CHARGES.append(x)
    return _Unencodable() if BROKEN["on"] else x


@durable.workflow(name="cpb.order")
def order(cents: int) -> str:
    return charge(cents) + "!"


@durable.workflow(name="cpb.order_unencodable")
def order_unencodable(x: int) -> Any:
    return unencodable(x)


def _ops(env: WorkflowEnvironment, eid: str) -> list[tuple[str, str]]:
    docs = env.engine.store.query_partition(eid).docs
    return [(str(d["action"]), str(d["by"])) for d in docs if d.get("type") == "operation"]


def test_env_holds_a_step_whose_result_cannot_be_encoded_as_a_worker_does() -> None:
    """On a worker (glue/durable_activity.py ``_run_attempt``) and in the LocalWorker a result the
    codec refuses fails the attempt inside the ``try`` — held when ``pause_on_failure``.
    WorkflowEnvironment must do the same: the execution paused, not failed."""
    BROKEN["on"] = True
    CHARGES.clear()
    env = WorkflowEnvironment(durable)
    env.start(order_unencodable, 3, _workflow_id="cpb-enc")
    ex = env.engine.read_exec("cpb-enc")
    assert ex["status"] == "running" and ex.get("paused"), ex.get("status")


def test_unpause_after_a_cancel_does_not_run_the_held_step_again() -> None:
    """A step held by pause_on_failure, then the operator cancels the (paused) execution — the
    cancel is recorded, delivered at the unpause. Unpausing must deliver the cancel, not first
    send the held step again: the activity (a charge) must not run after the cancel."""
    BROKEN["on"] = True
    CHARGES.clear()
    env = WorkflowEnvironment(durable)
    env.start(order, 5, _workflow_id="cpb-cancel")
    assert env.engine.read_exec("cpb-cancel").get("paused")
    runs = len(CHARGES)
    assert env.engine.cancel("cpb-cancel", by="ops")
    BROKEN["on"] = False
    from celery_durable.engine.admin.pause import unpause

    assert unpause(env.engine, "cpb-cancel", "ops")
    env.run_until_idle()
    assert env.engine.read_exec("cpb-cancel")["status"] == "cancelled"
    assert len(CHARGES) == runs, f"charged again after the cancel: {CHARGES}"


def test_unpause_before_the_fix_pauses_again() -> None:
    """Unpaused while the cause is still there: the step fails again (its retries afresh) and
    pauses the execution again (a second pause_on_failure record), never failing it."""
    BROKEN["on"] = True
    env = WorkflowEnvironment(durable)
    env.start(order, 7, _workflow_id="cpb-again")
    from celery_durable.engine.admin.pause import unpause

    assert unpause(env.engine, "cpb-again", "ops")
    env.run_until_idle()
    ex = env.engine.read_exec("cpb-again")
    assert ex["status"] == "running" and ex.get("paused")
    assert _ops(env, "cpb-again") == [
        ("pause", "pause_on_failure"),
        ("unpause", "ops"),
        ("pause", "pause_on_failure"),
    ]
    BROKEN["on"] = False
    assert unpause(env.engine, "cpb-again", "ops")
    env.run_until_idle()
    assert env.engine.read_exec("cpb-again")["result"] == "charged 7!"


LIMITED_BROKEN = {"on": True}


@durable_activity(name="cpb.limited", pause_on_failure=True, limit=Limit("cpb-lim", max_running=1))
def limited(tag: str) -> str:
    CHARGES.append(tag)  # type: ignore[arg-type]
    if LIMITED_BROKEN["on"] and tag == "a":
        raise ConnectionRefusedError("down")
    return tag


@durable.workflow(name="cpb.limited_job")
def limited_job(tag: str) -> str:
    return limited(tag)


def test_a_held_step_gives_its_limit_slot_back() -> None:
    """A held step has no lease: its slot of ``limit=`` is given back, so another execution's
    step of the same limit runs meanwhile; after the unpause the held one runs and every slot is
    free again."""
    LIMITED_BROKEN["on"] = True
    CHARGES.clear()
    env = WorkflowEnvironment(durable)
    env.start(limited_job, "a", _workflow_id="cpb-lim-a")
    assert env.engine.read_exec("cpb-lim-a").get("paused")
    hb = env.start(limited_job, "b", _workflow_id="cpb-lim-b")
    assert hb.status() == "completed" and hb.result() == "b"
    LIMITED_BROKEN["on"] = False
    from celery_durable.engine.admin.pause import unpause

    assert unpause(env.engine, "cpb-lim-a", "ops")
    env.run_until_idle()
    assert env.engine.read_exec("cpb-lim-a")["result"] == "a"


OPS: dict[str, Any] = {}


@durable_activity(name="cpb.racing", pause_on_failure=True)
def racing(mode: str) -> str:
    """Fails once; before failing, an operator acts on its execution (``mode``)."""
    eid = OPS["eid"]
    if OPS.get("failed"):
        return "ok"
    OPS["failed"] = True
    env = OPS["env"]
    if mode == "pause":
        from celery_durable.engine.admin.pause import pause

        assert pause(env.engine, eid, "ops")
    elif mode == "cancel":
        assert env.engine.cancel(eid, by="ops")
    raise ConnectionRefusedError("down")


@durable.workflow(name="cpb.racing_job")
def racing_job(mode: str) -> str:
    return racing(mode)


def _racing(mode: str) -> WorkflowEnvironment:
    env = WorkflowEnvironment(durable)
    OPS.clear()
    OPS.update(env=env, eid=f"cpb-race-{mode}")
    env.start(racing_job, mode, _workflow_id=f"cpb-race-{mode}")
    return env


def test_a_failure_while_an_operator_paused_it_is_held_and_unpause_reruns_it() -> None:
    """Paused by an operator while the attempt ran, then the attempt fails for good: the step is
    held (no second pause record), and the operator's unpause runs it again."""
    env = _racing("pause")
    assert env.engine.read_exec("cpb-race-pause").get("paused")
    assert _ops(env, "cpb-race-pause") == [("pause", "ops")]
    from celery_durable.engine.admin.pause import unpause

    assert unpause(env.engine, "cpb-race-pause", "ops")
    env.run_until_idle()
    assert env.engine.read_exec("cpb-race-pause")["result"] == "ok"


def test_a_failure_after_a_cancel_request_does_not_pause_the_cancel_away() -> None:
    """An operator cancels the execution while its attempt runs; the attempt then fails for
    good. pause_on_failure must not pause an execution whose cancel is pending (nobody is left to
    unpause it: the operator already said stop): the failure is recorded as without the option, and
    the execution ends (failed by the activity's error if its code meets that before the cancel is
    delivered, as without the option; cancelled otherwise), never left paused."""
    env = _racing("cancel")
    env.run_until_idle()
    ex = env.engine.read_exec("cpb-race-cancel")
    assert ex["status"] in ("cancelled", "failed") and not ex.get("paused"), (
        ex["status"],
        _ops(env, "cpb-race-cancel"),
    )
    assert ("pause", "pause_on_failure") not in _ops(env, "cpb-race-cancel")


@pytest.mark.parametrize(
    "node",
    [
        {"task": "cpb.add", "args": "12"},  # would run add("1", "2") = 3
        {"task": "cpb.add", "args": [1], "kwargs": "y"},  # fails inside the execution
        {"subtask_type": "group", "kwargs": {"tasks": "abc"}},  # AttributeError in check_canvas
        {"subtask_type": "group", "kwargs": {"tasks": [["cpb.add", [1, 2]]]}},  # AttributeError
    ],
    ids=["args-a-string", "kwargs-a-string", "tasks-a-string", "member-a-list"],
)
def test_a_malformed_canvas_dict_is_refused_at_run(node: dict[str, Any]) -> None:
    """durable.run() takes a signature or its JSON; a dict that is no signature (args not a
    list, kwargs not a mapping, members not signatures) is refused in the caller with a
    ConfigurationError, before anything is stored — not run with its string split into
    arguments, failed later inside the execution, or crashed with an AttributeError."""
    with pytest.raises(ConfigurationError):
        check_canvas(node, durable.registry)
