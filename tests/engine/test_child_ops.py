"""An operation's children are part of its recorded op (engine/admin/child_ops.py): a kill at any batch
of a retry leaves the old state or a recorded op that recovery finishes; the forgotten child's
refund stays recorded, once, and the failed child is retried, never told to the parent as is."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.errors import ActivityError, UnknownWorkflowError
from celery_durable.stores.base import Op
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("child-ops", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
broken = {"label": True}


@durable_activity(name="co.charge")
def charge(order: str) -> str:
    return "ch-" + order


@durable_activity(name="co.refund")
def refund(charge_id: str) -> str:
    return "refunded " + charge_id


@durable_activity(name="co.label")
def label(order: str) -> str:
    if broken["label"]:
        raise NonRetryableError("printer out of paper")
    return "LBL-" + order


@durable.workflow(name="co.refund_flow")
def refund_flow(charge_id: str) -> str:
    return refund(charge_id)


@durable.workflow(name="co.order")
def order(order_id: str) -> str:
    ch = charge(order_id)
    try:
        return label(order_id)
    except ActivityError:
        refund_flow.start_child(ch, _workflow_id=f"{wf.execution_id()}-refund").result()
        raise


@durable.workflow(name="co.labeller")
def labeller(order_id: str) -> str:
    return label(order_id)


@durable.workflow(name="co.parent")
def parent(order_id: str) -> str:
    return labeller.start_child(order_id, _workflow_id=f"{wf.execution_id()}-kid").result()


class Killed(BaseException):  # noqa: N818 - a process dying
    pass


@pytest.fixture
def env() -> WorkflowEnvironment:
    broken["label"] = True
    return WorkflowEnvironment(durable)


def _retry_killed_at(env: WorkflowEnvironment, eid: str, kill_at: int) -> bool:
    """Retry ``eid`` with the process killed at its ``kill_at``-th store batch (any partition);
    whether the kill happened. Then beat's recovery scans, as time goes on."""
    real, seen = env.store.batch, [0]

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        seen[0] += 1
        if seen[0] == kill_at:
            raise Killed(f"killed at batch {kill_at} ({pk})")
        return real(pk, ops)

    env.store.batch = batch  # type: ignore[method-assign]
    killed = False
    try:
        Admin(env.engine).retry(eid, by="ops")
    except Killed:
        killed = True
    finally:
        env.store.batch = real  # type: ignore[method-assign]
    for _ in range(4):
        env.clock.advance(env.engine.settings.activity_queue_timeout + env.engine.settings.drive_timeout + 1)
        env.engine.recovery.scan()
        env.run_until_idle()
    return killed


@pytest.mark.parametrize("kill_at", range(1, 8))
def test_a_retry_killed_at_any_batch_keeps_the_forgotten_childs_refund_recorded(
    env: WorkflowEnvironment, kill_at: int
) -> None:
    eid = f"co-{kill_at}"
    h = env.start(order, eid, _workflow_id=eid)
    env.run_until_idle()
    assert h.status() == "failed" and env.handle(f"{eid}-refund").status() == "completed"
    broken["label"] = False
    killed = _retry_killed_at(env, eid, kill_at)
    if h.status() == "failed":  # killed before the first batch: the old state (no record), retry again
        assert killed and not Admin(env.engine).describe(eid).operations, "a recorded retry was undone"
        assert env.handle(f"{eid}-refund").status() == "completed"
        Admin(env.engine).retry(eid, by="ops")
        env.run_until_idle()
    assert h.status() == "completed", (kill_at, h.status())
    info = Admin(env.engine).describe(eid)
    kept = [(s.execution, s.name, s.value) for s in info.superseded if s.execution]
    assert kept == [(f"{eid}-refund", "co.refund", f"refunded ch-{eid}")], (kill_at, kept)


@pytest.mark.parametrize("kill_at", range(1, 6))
def test_a_retry_killed_at_any_batch_retries_the_failed_child(env: WorkflowEnvironment, kill_at: int) -> None:
    eid = f"cp-{kill_at}"
    h = env.start(parent, eid, _workflow_id=eid)
    env.run_until_idle()
    assert h.status() == "failed" and env.handle(f"{eid}-kid").status() == "failed"
    broken["label"] = False
    killed = _retry_killed_at(env, eid, kill_at)
    if h.status() == "failed":  # killed before the first batch: the old state (no record), retry again
        assert killed and not Admin(env.engine).describe(eid).operations, "a recorded retry was undone"
        assert env.handle(f"{eid}-kid").status() == "failed"
        Admin(env.engine).retry(eid, by="ops")
        env.run_until_idle()
    assert h.status() == "completed" and env.result(h) == f"LBL-{eid}", (kill_at, h.status())
    kid_ops = [o["by"] for o in Admin(env.engine).describe(f"{eid}-kid").operations]
    assert kid_ops == [f"via parent {eid}"], (kill_at, kid_ops)  # retried once, recorded


def test_a_forgotten_childs_id_names_the_action_that_forgot_it(env: WorkflowEnvironment) -> None:
    h = env.start(order, "co-x", _workflow_id="co-x")
    env.run_until_idle()
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="ops", reason="printer fixed")
    env.run_until_idle()
    with pytest.raises(UnknownWorkflowError, match="forgotten by the retry of co-x by ops"):
        Admin(env.engine).describe("co-x-refund")


@durable.workflow(name="co.grandparent")
def grandparent(order_id: str) -> str:
    return order.start_child(order_id, _workflow_id=f"{wf.execution_id()}-order").result()


@pytest.mark.parametrize("kill_at", range(1, 8))
def test_a_retry_killed_at_any_batch_of_a_child_that_forgets_its_own_child(
    env: WorkflowEnvironment, kill_at: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The failed child's own retry forgets a grandchild (its refund): the child's commit is a
    pending op too; a kill inside it leaves both recorded, finished by recovery in any order
    (the parent's finisher does not retry a child whose own op, ours, is pending: it refused)."""
    eid = f"cg-{kill_at}"
    h = env.start(grandparent, eid, _workflow_id=eid)
    env.run_until_idle()
    assert h.status() == "failed" and env.handle(f"{eid}-order-refund").status() == "completed"
    broken["label"] = False
    killed = _retry_killed_at(env, eid, kill_at)
    if h.status() == "failed":  # killed before the first batch: the old state (no record), retry again
        assert killed and not Admin(env.engine).describe(eid).operations, "a recorded retry was undone"
        Admin(env.engine).retry(eid, by="ops")
        env.run_until_idle()
    assert h.status() == "completed" and env.result(h) == f"LBL-{eid}", (kill_at, h.status())
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"], kill_at
    info = Admin(env.engine).describe(f"{eid}-order")
    assert [o["by"] for o in info.operations] == [f"via parent {eid}"], kill_at
    kept = [(s.execution, s.value) for s in info.superseded if s.execution]
    assert kept == [(f"{eid}-order-refund", f"refunded ch-{eid}")], (kill_at, kept)


def test_a_retry_killed_between_forgetting_a_child_and_its_pointer_writes_the_pointer_when_finished(
    env: WorkflowEnvironment,
) -> None:
    h = env.start(order, "co-p", _workflow_id="co-p")
    env.run_until_idle()
    broken["label"] = False
    real = env.store.create

    def create(doc: dict[str, object]) -> object:
        if doc.get("pk") == "co-p-refund" and doc.get("type") == "purged":  # the pointer
            raise Killed("killed after the child's purge, before its pointer")
        return real(doc)

    env.store.create = create  # type: ignore[method-assign,assignment]
    with pytest.raises(Killed):
        Admin(env.engine).retry(h.id, by="ops")
    env.store.create = real  # type: ignore[method-assign]
    for _ in range(4):  # beat's recovery scans: it finishes the op, then re-sends the re-armed step
        env.clock.advance(env.engine.settings.activity_queue_timeout + env.engine.settings.drive_timeout + 1)
        env.engine.recovery.scan()
        env.run_until_idle()
    assert h.status() == "completed"
    with pytest.raises(UnknownWorkflowError, match="forgotten by the retry of co-p by ops"):
        Admin(env.engine).describe("co-p-refund")


@durable.workflow(name="co.helper", signals={"answer": str})
def helper(order_id: str) -> str:
    return str(wf.wait_signal("answer"))


@durable.workflow(name="co.escalate")
def escalate(order_id: str) -> str:
    try:
        return label(order_id)
    except ActivityError:
        try:
            helper.start_child(order_id, _workflow_id=f"{wf.execution_id()}-help").result()
        except Exception:  # noqa: BLE001 - the helper was cancelled: give up as before
            pass
        raise


def test_show_lists_who_cancelled_a_forgotten_child(env: WorkflowEnvironment) -> None:
    from celery_durable.cli.operator_actions import lines

    h = env.start(escalate, "co-e", _workflow_id="co-e")
    env.run_until_idle()
    env.handle("co-e-help").cancel(by="alice", reason="nobody answers")
    env.run_until_idle()
    assert h.status() == "failed"
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="bob")
    env.run_until_idle()
    shown = "\n".join(lines(Admin(env.engine).describe(h.id)))
    assert "cancel by alice" in shown and "nobody answers" in shown, shown


def test_a_retry_whose_failed_child_would_refuse_its_own_retry_is_refused_before_writing(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed child's retry is refused (say a step of it is still running): the parent's retry
    is refused with nothing written, not left pending with its record until the child's ends."""
    from celery_durable.engine.admin.operator import OperationRefused

    h = env.start(parent, "co-r", _workflow_id="co-r")
    env.run_until_idle()
    assert h.status() == "failed"
    real = Admin._plan_retry

    def plan_retry(self: Admin, ex: dict[str, object], docs: dict[str, dict[str, object]]) -> object:
        if ex["pk"] == "co-r-kid":
            raise OperationRefused("step 2 of co-r-kid is still running; retry later")
        return real(self, ex, docs)  # type: ignore[arg-type]

    before = {d["id"]: d for d in env.store.query_partition("co-r").docs}
    monkeypatch.setattr(Admin, "_plan_retry", plan_retry)
    with pytest.raises(OperationRefused, match="co-r-kid is still running"):
        Admin(env.engine).retry(h.id, by="ops")
    assert {d["id"]: d for d in env.store.query_partition("co-r").docs} == before
