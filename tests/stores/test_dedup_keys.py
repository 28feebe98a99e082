"""Issue 26 §5: one running execution per dedup key (``options(dedup_key=..., on_conflict=...)``),
on every store: reject, return-existing, latest-wins; the key is free once its owner ended, was
purged, or was never created (a starter that died between its two writes, after the grace)."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_durable import (
    ConfigurationError,
    DuplicateStart,
    Durable,
    InvalidWorkflowId,
    NonRetryableError,
    durable_activity,
)
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.starts import dedup
from celery_durable.engine.starts.dedup import CANCELLED_BY, CLAIM_GRACE, OWNER_ID, dedup_pk, owner_of
from celery_durable.stores.base import Store
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("dedup-tests", set_as_current=False)
durable = Durable(app, store="memory://")
UNDONE: list[str] = []


@durable_activity(name="dedup.undo")
def undo(what: str) -> None:
    UNDONE.append(what)


@durable.workflow(name="dedup.report")
def report(day: str) -> str:
    """Holds its key until it gets ``go``; a cancel runs its compensation."""
    with wf.Saga() as saga:
        saga.add(undo, day)
        if wf.wait_signal("go", str) == "fail":
            raise NonRetryableError(f"{day} failed")
    return day


@durable.workflow(name="dedup.kid")
def kid(n: int) -> int:
    return report.options(dedup_key="k").start_child(str(n)).result()  # type: ignore[return-value]


def _env(store: Store) -> WorkflowEnvironment:
    UNDONE.clear()
    return WorkflowEnvironment(durable, store=store)


def _running(env: WorkflowEnvironment, key: str) -> list[str]:
    return sorted(
        e.id for e in env.list_executions(workflow="dedup.report", status="running").executions
        if (env.engine.store.read(e.id, "exec") or {}).get("dedup_key") == key
    )  # fmt: skip


def test_reject_while_running_and_free_once_it_ended(store: Store) -> None:
    env = _env(store)
    nightly = report.options(dedup_key="nightly")
    first = env.start(nightly, "mon")
    with pytest.raises(DuplicateStart) as refused:
        env.start(nightly, "tue")
    assert refused.value.existing == first.id and refused.value.key == "nightly"
    assert _running(env, "nightly") == [first.id]
    assert len(env.list_executions(workflow="dedup.report").executions) == 1  # nothing created
    env.signal(first, "go", "ok")
    assert first.status() == "completed"
    second = env.start(nightly, "tue")  # the owner ended: the key is free
    assert second.id != first.id and owner_of(env.engine.store, "nightly") == second.id
    env.signal(second, "go", "fail")
    assert second.status() == "failed"
    third = env.start(nightly, "wed")  # a failed owner frees it too
    assert _running(env, "nightly") == [third.id]
    # another key is another singleton
    other = env.start(report.options(dedup_key="weekly"), "w1")
    assert _running(env, "weekly") == [other.id]


def test_return_existing_answers_the_running_one(store: Store) -> None:
    env = _env(store)
    joined = report.options(dedup_key="sync", on_conflict="return-existing")
    first = env.start(joined, "a")
    again = env.start(joined, "b")
    assert again.id == first.id
    assert len(env.list_executions(workflow="dedup.report").executions) == 1
    env.signal(again, "go", "ok")
    assert env.result(first) == "a"


def test_latest_wins_cancels_the_running_one_and_its_compensations_run(store: Store) -> None:
    env = _env(store)
    latest = report.options(dedup_key="price", on_conflict="latest-wins")
    old = env.start(latest, "v1")
    new = env.start(latest, "v2")
    assert new.id != old.id
    assert old.status() == "cancelled" and UNDONE == ["v1"]
    assert _running(env, "price") == [new.id] and owner_of(env.engine.store, "price") == new.id
    ops = Admin(env.engine).describe(old.id).operations
    assert [(op["action"], op["by"]) for op in ops] == [("cancel", CANCELLED_BY)]
    assert f"superseded by {new.id}" in str(ops[0]["reason"])


def test_a_claim_whose_execution_never_came_holds_the_key_for_the_grace_only(store: Store) -> None:
    env = _env(store)
    # a starter that died between its claim and its create
    now = env.clock.now()
    env.engine.store.create(
        {"pk": dedup_pk("k"), "id": OWNER_ID, "type": "dedup_key", "key": "k", "execution": "ghost", "claimed_at": now}
    )
    with pytest.raises(DuplicateStart) as refused:
        env.start(report.options(dedup_key="k"), "x")
    assert refused.value.existing == "ghost"
    env.advance(CLAIM_GRACE + 1)
    h = env.start(report.options(dedup_key="k"), "x")
    assert owner_of(env.engine.store, "k") == h.id and h.status() == "running"


def test_a_start_again_with_its_own_id_joins_and_a_purged_owner_frees_the_key(store: Store) -> None:
    env = _env(store)
    opts = report.options(workflow_id="daily-1", dedup_key="daily")
    h = env.start(opts, "d")
    assert env.start(opts, "d").id == h.id  # its own claim: a retried start joins
    env.signal(h, "go", "ok")
    env.advance(1)
    assert Admin(env.engine).purge(0.5).purged == 1
    h2 = env.start(report.options(dedup_key="daily"), "e")
    assert owner_of(env.engine.store, "daily") == h2.id


def test_bad_options_fail_in_the_caller() -> None:
    for bad in ("", 5, "x" * 1001):
        with pytest.raises(ConfigurationError, match="dedup key"):
            report.options(dedup_key=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_conflict must be one of"):
        report.options(dedup_key="k", on_conflict="ignore")  # type: ignore[arg-type]
    with pytest.raises(InvalidWorkflowId, match="reserved"):
        report.options(workflow_id=dedup_pk("k"))
    assert (
        dedup.DEDUP_PK_PREFIX
        in __import__("celery_durable.engine.documents.checks", fromlist=["x"]).RESERVED_ID_PREFIXES
    )


def test_a_child_takes_no_dedup_key() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(kid, 1)
    assert h.status() == "failed"
    assert "dedup key" in str(env.engine.store.read(h.id, "exec")["error"])  # type: ignore[index]
