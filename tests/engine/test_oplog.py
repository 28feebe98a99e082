"""Nothing that ran is forgotten (issue 23, item 4; engine/admin/oplog.py): every operator action is
recorded with who, when and why, and the steps retry/resume/reset forget stay visible as
superseded, with their values, in ``describe()``, ``durable show`` (text and ``--json``).

The module is also the Celery app the CLI runs against (``-A tests.engine.test_oplog``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner, Result

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.errors import ActivityError, StoreUnavailable, UnknownWorkflowError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("oplog-tests", set_as_current=False, broker="memory://")  # the CLI's sends go nowhere
durable = Durable(app, store="memory://")
calls: list[str] = []
broken = {"label": True}


@durable_activity(name="ol.charge")
def charge(order: str) -> str:
    calls.append("charge")
    return "ch-" + order


@durable_activity(name="ol.refund")
def refund(charge_id: str) -> str:
    calls.append("refund")
    return "refunded " + charge_id


@durable_activity(name="ol.label")
def label(order: str) -> str:
    if broken["label"]:
        raise NonRetryableError("printer out of paper")
    calls.append("label")
    return "LBL-" + order


@durable.workflow(name="ol.order", signals={"ship": bool})
def order(order_id: str, wait: bool = False) -> str:
    with wf.Saga() as saga:
        ch = charge(order_id)
        saga.add(refund, ch)
        if wait:
            wf.wait_signal("ship")
        return label(order_id)


@durable.workflow(name="ol.refund_flow")
def refund_flow(charge_id: str) -> str:
    return refund(charge_id)


@durable.workflow(name="ol.order_child")
def order_child(order_id: str) -> str:
    """Compensates in a child workflow: the retry deletes that (finished) child."""
    ch = charge(order_id)
    try:
        return label(order_id)
    except ActivityError:
        refund_flow.start_child(ch, _workflow_id=f"{wf.execution_id()}-refund").result()
        raise


@durable.workflow(name="ol.kid", signals={"ship": bool})
def kid(order_id: str) -> str:
    wf.wait_signal("ship")
    return "kid " + order_id


@durable.workflow(name="ol.parent")
def parent(order_id: str) -> str:
    return kid.start_child(order_id, _workflow_id=f"{wf.execution_id()}-kid").result()


@durable.workflow(name="ol.trip")
def trip(legs: int) -> str:
    """``legs`` bookings, each with its compensation: a retry forgets them in several batches."""
    with wf.Saga() as saga:
        for i in range(legs):
            charge(f"leg{i}")
            saga.add(refund, f"leg{i}")
        return label("trip")


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    calls.clear()
    broken["label"] = True
    durable.configure(store=f"sqlite:///{tmp_path / 'oplog.db'}")  # shared with the CLI
    return WorkflowEnvironment(durable, store=durable.store)


def _cli(*args: str, input: str | None = None) -> Result:  # noqa: A002
    return CliRunner().invoke(celery_cli, ["-A", "tests.engine.test_oplog", "durable", *args], input=input)


def _failed_and_refunded(env: WorkflowEnvironment, eid: str = "o-1") -> Any:
    h = env.start(order, eid, _workflow_id=eid)
    assert h.status() == "failed" and calls == ["charge", "refund"]
    return h


def test_a_plain_retry_records_itself_and_the_refund_it_forgot(env: WorkflowEnvironment) -> None:
    """The repro as it stands (no new arguments): ``operations == ()`` after the retry, before."""
    h = _failed_and_refunded(env)
    broken["label"] = False
    Admin(env.engine).retry(h.id)
    assert env.result(h) == "LBL-o-1"
    info = durable.describe(h.id)
    assert info.operations, "a retry that forgot a compensation that ran left no record"
    assert "ol.refund" in [s.name for s in getattr(info, "superseded", ())]


def test_retry_after_a_compensation_keeps_it_visible_as_superseded(env: WorkflowEnvironment) -> None:
    """The repro (operable/newcomer_retry_leaves_no_record.py): the refund ran, then the retry
    forgot it; the record of the retry and the refund, with its value, must stay."""
    h = _failed_and_refunded(env)
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="alice", reason="printer fixed")
    assert env.result(h) == "LBL-o-1" and calls == ["charge", "refund", "label"]
    info = durable.describe(h.id)
    assert [(s.seq, s.name, s.state) for s in info.steps] == [(1, "ol.charge", "ok"), (2, "ol.label", "ok")]
    (op,) = info.operations
    assert (op["action"], op["by"], op["reason"], op["status"]) == ("retry", "alice", "printer fixed", "failed")
    assert isinstance(op["at"], float)
    gone = [(s.seq, s.name, s.state, s.value, s.action, s.by) for s in info.superseded]
    assert gone == [
        (2, "ol.label", "failed", None, "retry", "alice"),
        (3, "ol.refund", "ok", "refunded ch-o-1", "retry", "alice"),
    ]
    assert "printer out of paper" in (info.superseded[0].error or "")

    text = _cli("show", h.id)
    assert text.exit_code == 0, text.output
    assert "retry by alice" in text.output and "printer fixed" in text.output and "forgot 2 step(s)" in text.output
    assert "superseded step 3 ol.refund (activity, ok)" in text.output and "refunded ch-o-1" in text.output
    data = json.loads(_cli("show", h.id, "--json").output)
    assert [o["action"] for o in data["operations"]] == ["retry"]
    refund_row = [(s["name"], s["state"], s["value"]) for s in data["superseded"]][1]
    assert refund_row == ("ol.refund", "ok", "refunded ch-o-1")


def test_the_retry_prompt_says_which_compensations_ran(env: WorkflowEnvironment) -> None:
    h = _failed_and_refunded(env)
    out = _cli("retry", h.id, input="n\n")
    assert out.exit_code == 1, out.output  # aborted: nothing done
    assert "step 3 ol.refund (activity, ok)  <- it RAN" in out.output, out.output
    assert "step 2 ol.label (activity, failed)" in out.output
    assert durable.describe(h.id).operations == () and h.status() == "failed"


def test_resume_of_a_cancelled_order_keeps_the_first_refund(env: WorkflowEnvironment) -> None:
    """``resume`` of a cancelled order: the refund the cancel ran stays in the record, the cancel
    and the resume are recorded (who), and the resume prompt warns that the refund ran."""
    broken["label"] = False
    h = env.start(order, "o-2", True, _workflow_id="o-2")
    h.cancel(by="bob", reason="customer called")
    env.run_until_idle()
    assert h.status() == "cancelled" and calls == ["charge", "refund"]
    out = _cli("resume", h.id, input="n\n")
    assert "ol.refund (activity, ok)  <- it RAN" in out.output, out.output
    Admin(env.engine).resume(h.id, by="carol")
    env.signal(h, "ship", True)
    assert env.result(h) == "LBL-o-2"
    info = durable.describe(h.id)
    assert [(o["action"], o["by"], o["reason"]) for o in info.operations] == [
        ("cancel", "bob", "customer called"),
        ("resume", "carol", None),
    ]
    refunds = [s for s in info.superseded if s.name == "ol.refund"]
    assert [(s.state, s.value, s.action) for s in refunds] == [("ok", "refunded ch-o-2", "resume")]


def test_every_operator_action_is_recorded_with_who_when_and_why(env: WorkflowEnvironment) -> None:
    adm = Admin(env.engine)
    h = env.start(order, "o-3", True, _workflow_id="o-3")
    assert _cli("signal", h.id, "ship", "true").exit_code == 0  # the CLI records who sent it
    env.run_until_idle()  # the value waits for the drive the env's own engine sends
    adm.resume(h.id, by="gina", reason="drive it now")  # running: driven now, recorded
    env.run_until_idle()
    assert h.status() == "failed"
    adm.retry(h.id)  # by defaults to user@host
    env.run_until_idle()
    h.reset(step=1, by="dave", reason="from scratch")
    env.run_until_idle()
    assert h.status() == "failed"
    ops = durable.describe(h.id).operations
    assert [o["action"] for o in ops] == ["signal", "resume", "retry", "reset"]
    assert all(isinstance(o["at"], float) and o["by"] for o in ops)
    assert ops[0]["name"] == "ship" and "@" in ops[0]["by"] and "@" in ops[2]["by"]
    assert (ops[1]["by"], ops[1]["reason"], ops[1]["status"]) == ("gina", "drive it now", "running")
    assert (ops[3]["by"], ops[3]["reason"], ops[3]["step"]) == ("dave", "from scratch", 1)
    assert {e["name"] for e in ops[3]["forgotten"]} == {"ol.charge", "ship", "ol.label", "ol.refund"}
    ex = env.store.read(h.id, "exec")
    assert ex is not None and ex["operations"] == len(ops)


def test_purge_leaves_a_record_that_describe_quotes(env: WorkflowEnvironment, caplog: Any) -> None:
    broken["label"] = False
    h = env.start(order, "o-4", _workflow_id="o-4")
    assert env.result(h) == "LBL-o-4"
    env.clock.advance(100)
    with caplog.at_level("INFO", logger="celery_durable.operations"):
        report = Admin(env.engine).purge(10, by="erin")
    assert report.purged == 1
    assert "purged o-4" in caplog.text and "by erin" in caplog.text
    with pytest.raises(UnknownWorkflowError, match="purged by erin"):
        durable.describe(h.id)
    # the id can be used again; the record does not get in the way
    h2 = env.start(order, "o-4", _workflow_id="o-4")
    assert env.result(h2) == "LBL-o-4" and durable.describe(h2.id).operations == ()


@durable_activity(name="ol.big")
def big(i: int) -> str:
    return "x" * 5000 + str(i)


@durable.workflow(name="ol.many")
def many(n: int) -> None:
    for i in range(n):
        big(i)
    label("m")


@pytest.mark.parametrize("parts", [None, 2, 1])
def test_a_big_forgotten_history_is_archived_capped_never_failing(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, parts: int | None
) -> None:
    """Values too large are kept as the start of their JSON (flagged); an archive past one
    document spills over part documents (each small), every step kept; past ``MAX_PARTS`` values
    are shortened further, and only steps that still do not fit are counted (``forgotten_more``):
    the reset is not refused (r1 break: 200 steps were kept, the rest only counted)."""
    from celery_durable.engine.admin import oplog

    if parts is not None:
        monkeypatch.setattr(oplog, "MAX_PARTS", parts)

    n = oplog.MAX_ENTRIES + 30
    h = env.start(many, n)
    assert h.status() == "failed"
    h.reset(step=1, by="frank")
    (op,) = Admin(env.engine).describe(h.id).operations
    entries = op["forgotten"]
    stored = [d for d in env.store.query_partition(h.id).docs if str(d["id"]).startswith("op:")]
    assert all(len(json.dumps(d)) < 2 * oplog.MAX_ARCHIVE_BYTES for d in stored)
    assert len(stored) == 1 + op["archive_parts"] <= oplog.MAX_PARTS
    assert len(entries) + op["forgotten_more"] == n + 1  # every step: archived or counted
    assert sorted(e["seq"] for e in entries) == [e["seq"] for e in entries]  # in step order
    assert entries[0]["value_truncated"] is True and entries[0]["value"].startswith('"xxx')
    assert op["forgotten_more"] == (oplog.MAX_PARTS == 1) * (n + 1 - oplog.MAX_ENTRIES)
    if parts == 2:  # every step kept, its value shortened
        assert len(entries[0]["value"]) == oplog.SHORT_VALUE_CHARS
    out = _cli("show", h.id).output
    assert "(value truncated)" in out and f"forgot {n + 1} step(s)" in out
    if op["forgotten_more"]:
        assert f"and {op['forgotten_more']} more superseded step(s)" in out


def test_reasons_and_actors_that_are_not_text_are_refused_before_any_write(env: WorkflowEnvironment) -> None:
    h = _failed_and_refunded(env)
    before = {d["id"] for d in env.store.query_partition(h.id).docs}
    with pytest.raises(ValueError, match="reason must be a string"):
        Admin(env.engine).retry(h.id, reason={"not": "text"})  # type: ignore[arg-type]
    assert {d["id"] for d in env.store.query_partition(h.id).docs} == before and h.status() == "failed"
    # the limits reset enforces hold for every recorded action: refused, never truncated
    for bad in ({"reason": "r" * 5000}, {"by": ""}, {"by": "b" * 300}):
        with pytest.raises(ValueError, match="(reason|by) (is|must)"):
            Admin(env.engine).retry(h.id, **bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            Admin(env.engine).resume(h.id, **bad)  # type: ignore[arg-type]
    assert {d["id"] for d in env.store.query_partition(h.id).docs} == before and h.status() == "failed"


def test_a_child_the_retry_deletes_is_archived_with_its_steps(env: WorkflowEnvironment) -> None:
    """The compensation ran in a child workflow started after the failed step: the retry deletes
    the child (the re-run starts its own, if any); its refund stays in the parent's record."""
    h = env.start(order_child, "o-5", _workflow_id="o-5")
    assert h.status() == "failed" and calls == ["charge", "refund"]
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="hana")
    assert env.result(h) == "LBL-o-5"
    with pytest.raises(UnknownWorkflowError):
        durable.describe("o-5-refund")
    info = durable.describe(h.id)
    (child,) = info.operations[0]["forgotten_children"]
    assert (child["id"], child["workflow"], child["status"]) == ("o-5-refund", "ol.refund_flow", "completed")
    kept = [(s.execution, s.name, s.state, s.value) for s in info.superseded if s.execution]
    assert kept == [("o-5-refund", "ol.refund", "ok", "refunded ch-o-5")]
    out = _cli("show", h.id).output
    assert "forgotten child execution o-5-refund (completed, deleted)" in out
    assert "superseded step 1 ol.refund (activity, ok)" in out


def test_a_child_reopened_through_its_parent_records_it(env: WorkflowEnvironment) -> None:
    h = env.start(parent, "o-6", _workflow_id="o-6")
    h.cancel(by="ivan")
    env.run_until_idle()
    assert h.status() == "cancelled" and env.handle("o-6-kid").status() == "cancelled"
    Admin(env.engine).resume(h.id, by="ivan")
    env.run_until_idle()
    env.signal("o-6-kid", "ship", True)
    assert env.result(h) == "kid o-6"
    ops = durable.describe("o-6-kid").operations
    assert [(o["action"], o["by"]) for o in ops] == [("resume", "via parent o-6")]
    assert [(o["action"], o["by"]) for o in durable.describe(h.id).operations] == [
        ("cancel", "ivan"),
        ("resume", "ivan"),
    ]


def test_a_retry_cut_between_its_batches_leaves_the_archive_of_what_it_deleted(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite wider than a batch holds its record in the exec's pending op from its first
    batch (engine/admin/pending_ops.py): a store failure (or a kill) before the next leaves the deleted
    steps archived and shown, never deleted and unrecorded; the next operator call finishes the
    cut retry first (recorded once, with everything it forgot) and is then judged on the result."""
    h = env.start(trip, 70)  # 70 refunds: 140+ documents to delete, two batches and more
    assert h.status() == "failed" and calls.count("refund") == 70
    real, seen = env.store.batch, []

    def flaky(pk: str, ops: list[Any]) -> Any:
        seen.append(len(ops))
        if len(seen) == 2:
            raise StoreUnavailable("the store went away between two batches")
        return real(pk, ops)

    monkeypatch.setattr(env.store, "batch", flaky)
    with pytest.raises(StoreUnavailable):
        Admin(env.engine).retry(h.id, by="jo")
    monkeypatch.setattr(env.store, "batch", real)
    first = durable.describe(h.id)
    assert [o["id"] for o in first.operations] == ["op:000001"] and h.status() == "failed"
    gone = set(range(71, 142)) - {s.seq for s in first.steps}  # label (71) and the refunds deleted
    assert gone and gone <= {s.seq for s in first.superseded}  # what is gone is archived
    broken["label"] = False
    with pytest.raises(OperationRefused, match="not failed"):  # the cut retry, finished: running
        Admin(env.engine).retry(h.id, by="jo")
    # the re-armed step's message was the cut process's to send: recovery re-sends it
    env.clock.advance(env.engine.settings.activity_queue_timeout + 1)
    env.engine.recovery.scan()
    assert env.result(h) == "LBL-trip"
    info = durable.describe(h.id)
    assert [o["id"] for o in info.operations] == ["op:000001"]
    refunds = [s for s in info.superseded if s.name == "ol.refund" and s.state == "ok"]
    assert sorted(s.value for s in refunds) == sorted(f"refunded leg{i}" for i in range(70))  # every one


def test_the_reset_prompt_names_what_it_forgets_and_what_ran(env: WorkflowEnvironment) -> None:
    h = _failed_and_refunded(env)
    out = _cli("reset", h.id, "--step", "1", input="n\n")
    assert out.exit_code == 1, out.output  # aborted: nothing done
    assert "step 1 ol.charge (activity, ok)  <- it RAN" in out.output, out.output
    assert "step 3 ol.refund (activity, ok)  <- it RAN" in out.output
    assert durable.describe(h.id).operations == () and h.status() == "failed"


def test_a_reset_archives_the_child_it_deletes(env: WorkflowEnvironment) -> None:
    h = env.start(order_child, "o-7", _workflow_id="o-7")
    assert h.status() == "failed"
    h.reset(step=1, by="kim")
    (op,) = durable.describe(h.id).operations
    assert [c["id"] for c in op["forgotten_children"]] == ["o-7-refund"]
    kept = [(s.execution, s.name, s.value) for s in durable.describe(h.id).superseded if s.execution]
    assert kept == [("o-7-refund", "ol.refund", "refunded ch-o-7")]


def test_the_cli_cancel_records_the_os_user_and_the_reason(env: WorkflowEnvironment) -> None:
    h = env.start(order, "o-8", True, _workflow_id="o-8")
    out = _cli("cancel", h.id, "--yes", "--reason", "duplicate order")
    assert out.exit_code == 0 and "cancel requested" in out.output, out.output
    (op,) = durable.describe(h.id).operations
    assert (op["action"], op["reason"], op["status"]) == ("cancel", "duplicate order", "running")
    from celery_durable.engine.admin.oplog import actor

    assert op["by"] == actor()  # the OS user, @host
