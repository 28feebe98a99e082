"""Breaking the dedup keys (issue 26 §5, docs/guides/dedup.md): each test fails on the code as it
stands, naming the promise it breaks."""

from __future__ import annotations

import datetime

import pytest
from celery import Celery

from celery_durable import ConfigurationError, DuplicateStart, Durable
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.starts.dedup import CLAIM_GRACE, OnConflict
from celery_durable.errors import DurableError, StoreUnavailable, UnknownWorkflowError
from celery_durable.handle import WorkflowHandle
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("dedup-breaks", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="brk.hold")
def hold(x: str) -> str:
    """Holds its key until it gets ``go``."""
    wf.wait_signal("go", str)
    return x


@durable.workflow(name="brk.other")
def other(x: str) -> str:
    wf.wait_signal("go", str)
    return x


@durable.workflow(name="brk.day")
def day(x: str) -> datetime.date:
    """Another workflow, typed otherwise, that shares a key with ``hold``."""
    wf.wait_signal("go", str)
    return datetime.date(2000, 1, 1)


@durable.workflow(name="brk.tally")
def tally(n: int = 0) -> int:
    return n


def _running_holders(env: WorkflowEnvironment, key: str) -> list[str]:
    """Executions holding ``key`` that run and were not asked to cancel."""
    out = []
    for e in env.list_executions(status="running").executions:
        doc = env.engine.store.read(e.id, "exec") or {}
        if doc.get("dedup_key") == key and not doc.get("cancel_requested"):
            out.append(e.id)
    return sorted(out)


# --- a start refused (or joined) after its claim was written ------------------------------------


def test_latest_wins_refused_for_a_foreign_workflow_id_still_cancels_the_holder() -> None:
    env = WorkflowEnvironment(durable)
    foreign = env.start(other, "u")
    holder = env.start(hold.options(dedup_key="k", on_conflict="latest-wins"), "h")
    with pytest.raises(ConfigurationError, match="runs workflow"):
        env.start(hold.options(workflow_id=foreign.id, dedup_key="k", on_conflict="latest-wins"), "x")
    assert holder.status() == "running" and not env.engine.store.read(holder.id, "exec")["cancel_requested"], (
        "bad options fail in the caller / nothing changes silently: a latest-wins start refused with "
        "ConfigurationError (its workflow_id runs another workflow) has already cancelled the key's holder"
    )


def test_reject_refused_for_a_foreign_workflow_id_leaves_the_key_held_by_that_execution() -> None:
    env = WorkflowEnvironment(durable)
    foreign = env.start(other, "u")  # no key at all
    with pytest.raises(ConfigurationError, match="runs workflow"):
        env.start(hold.options(workflow_id=foreign.id, dedup_key="k"), "x")
    try:
        env.start(hold.options(dedup_key="k"), "y")
    except DuplicateStart as e:
        pytest.fail(
            "bad options fail in the caller and store nothing: a start refused with ConfigurationError "
            f"left its claim, so the key is held by {e.existing!r}, an execution of another workflow "
            "that never asked for it"
        )


def test_latest_wins_joining_an_ended_id_cancels_the_holder_and_nothing_runs() -> None:
    env = WorkflowEnvironment(durable)
    done = env.start(hold.options(workflow_id="done-1"), "d")
    env.signal(done, "go", "x")
    assert done.status() == "completed"
    holder = env.start(hold.options(dedup_key="k", on_conflict="latest-wins"), "h")
    h = env.start(hold.options(workflow_id="done-1", dedup_key="k", on_conflict="latest-wins"), "v2")
    assert h.id == "done-1"  # joined (a workflow id dedupes)
    assert _running_holders(env, "k") != [] or holder.status() == "running", (
        "latest-wins: the holder is cancelled and the new start runs: here the holder was cancelled "
        "for a start that joined an ended execution, and no execution runs for the key"
    )


# --- the key comes back to a holder that ended ----------------------------------------------------


def test_a_purged_holders_id_used_again_without_a_key_holds_the_key_again() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(hold.options(workflow_id="fixed", dedup_key="k2"), "h")
    env.signal(h, "go", "x")
    env.advance(10)
    assert Admin(env.engine).purge(1).purged == 1
    again = env.start(hold.options(workflow_id="fixed"), "again")  # no dedup key
    assert again.status() == "running" and "dedup_key" not in env.engine.store.read("fixed", "exec")
    try:
        env.start(hold.options(dedup_key="k2"), "y")
    except DuplicateStart as e:
        pytest.fail(
            "the key is free once its holder ended or was purged: a new execution of the purged "
            f"holder's id, started without any key, holds it again ({e.existing!r}); _owner() only "
            "looks at the status of whatever exec now has that id"
        )


# --- return-existing ----------------------------------------------------------------------------


def test_return_existing_across_workflows_decodes_the_holders_result_with_the_wrong_codec() -> None:
    env = WorkflowEnvironment(durable)
    a = env.start(hold.options(dedup_key="shared"), "2024-03-05")
    # refused in the caller: a handle typed as brk.day would decode brk.hold's result with the
    # wrong codec (its str '2024-03-05' came back as a date)
    with pytest.raises(DuplicateStart, match="an execution of workflow 'brk.hold'"):
        env.start(day.options(dedup_key="shared", on_conflict="return-existing"), "zzz")
    env.signal(a, "go", "x")
    assert env.result(a) == "2024-03-05"


def test_return_existing_racing_a_claim_answers_an_execution_that_does_not_exist() -> None:
    env = WorkflowEnvironment(durable)
    eng, create = env.engine, env.engine.create_execution
    seen: dict[str, object] = {}

    def between_claim_and_create(*args: object, **kwargs: object) -> bool:
        eng.create_execution = create  # type: ignore[method-assign]
        # a second caller, between the first one's claim and its create
        try:
            rid, _ = eng.start(tally.definition, (2,), {}, dedup=("race", OnConflict.RETURN_EXISTING))
            seen["status"] = WorkflowHandle(eng, rid).status()
        except UnknownWorkflowError as exc:
            seen["status"] = exc
        except DuplicateStart as exc:  # it waited for the create, which comes after: refused, honest
            seen["status"] = exc
        return create(*args, **kwargs)  # type: ignore[arg-type]

    eng.create_execution = between_claim_and_create  # type: ignore[method-assign]
    eng.start(tally.definition, (1,), {}, dedup=("race", OnConflict.RETURN_EXISTING))
    assert not isinstance(seen["status"], UnknownWorkflowError), (
        "callers racing get one execution / return-existing returns a handle to the running holder: "
        f"the racing caller's handle fails at once with {seen['status']!r} (claim() answers a PENDING "
        "owner's id before its execution exists)"
    )


# --- CLAIM_GRACE ---------------------------------------------------------------------------------


def test_a_dead_starter_with_a_fast_clock_holds_the_key_past_the_grace() -> None:
    t0 = 1_800_000_000.0
    fast = WorkflowEnvironment(durable, start=t0 + 300)  # this starter's clock is 5 minutes ahead
    env = WorkflowEnvironment(durable, store=fast.store, start=t0)

    def dies(*args: object, **kwargs: object) -> bool:
        raise StoreUnavailable("the starter died between its claim and its create")

    fast.engine.create_execution = dies  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        fast.engine.start(hold.definition, ("a",), {}, dedup=("skew", OnConflict.REJECT))
    env.clock.advance(CLAIM_GRACE + 1)  # the grace is over, in real time
    try:
        env.start(hold.options(dedup_key="skew"), "b")
    except DuplicateStart as e:
        pytest.fail(
            f"a starter that dies between its claim and its create holds the key at most CLAIM_GRACE "
            f"({CLAIM_GRACE}s): {CLAIM_GRACE + 1}s later it is still held by {e.existing!r}, because the "
            "grace is measured from the dead starter's own (skewed) clock: claimed_at > now"
        )


# --- the tombstone -------------------------------------------------------------------------------


def test_a_resumed_tombstone_runs_with_an_input_nobody_gave() -> None:
    env = WorkflowEnvironment(durable)
    eng, create = env.engine, env.engine.create_execution

    def slow(*args: object, **kwargs: object) -> bool:  # the first starter stalls past the grace
        eng.create_execution = create  # type: ignore[method-assign]
        env.clock.advance(CLAIM_GRACE + 1)
        eng.start(hold.definition, ("next",), {}, dedup=("t", OnConflict.REJECT))
        return create(*args, **kwargs)  # type: ignore[arg-type]

    eng.create_execution = slow  # type: ignore[method-assign]
    sid, created = eng.start(tally.definition, (7,), {}, dedup=("t", OnConflict.REJECT))
    h = WorkflowHandle(eng, sid, tally.definition)
    assert not created and h.status() == "cancelled"  # the documented handle to a cancelled execution
    try:
        Admin(eng).resume(sid)
    except DurableError:
        return  # refusing to resume an execution that never ran is honest
    env.run_until_idle()
    assert h.status() != "completed" or env.result(h) == 7, (
        "nothing runs twice and no value changes silently: the tombstone _tombstone() wrote in the "
        "slow starter's place records input [] instead of (7,); resumed, the workflow ran with its "
        f"default and returned {env.result(h)!r}"
    )


# --- bad options fail in the caller ----------------------------------------------------------------


def test_on_conflict_without_a_key_is_silently_ignored() -> None:
    with pytest.raises(ConfigurationError):
        hold.options(on_conflict="bogus")  # type: ignore[arg-type]


def test_a_key_that_cannot_be_encoded_passes_options() -> None:
    try:
        opts = hold.options(dedup_key="sku-\ud800")
    except ConfigurationError:
        return
    env = WorkflowEnvironment(durable)
    with pytest.raises(ConfigurationError):  # it fails at start, as a UnicodeEncodeError from dedup_pk
        env.start(opts, "x")
