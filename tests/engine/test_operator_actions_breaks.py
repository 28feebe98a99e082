"""Reviewer r1's breaks of issue 23's operator promises (each test fails on the reviewed code).

Focus: operator actions (retry, resume, reset, purge, cancel) validating before their first
write, being crash-safe, and recording everything they forget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.errors import ActivityError, StoreUnavailable, UnknownWorkflowError
from celery_durable.stores.base import Op
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("r1-breaks", set_as_current=False, broker="memory://")  # the CLI's sends go nowhere
durable = Durable(app, store="memory://")
calls: list[str] = []
broken = {"label": True}


@durable_activity(name="r1.charge")
def charge(order: str) -> str:
    calls.append("charge")
    return "ch-" + order


@durable_activity(name="r1.refund")
def refund(charge_id: str) -> str:
    calls.append("refund")
    return "refunded " + charge_id


@durable_activity(name="r1.label")
def label(order: str) -> str:
    if broken["label"]:
        raise NonRetryableError("printer out of paper")
    calls.append("label")
    return "LBL-" + order


@durable.workflow(name="r1.refund_flow")
def refund_flow(charge_id: str) -> str:
    return refund(charge_id)


@durable.workflow(name="r1.order_child")
def order_child(order_id: str) -> str:
    """Compensates in a child workflow started after the failed step: a retry forgets the child."""
    ch = charge(order_id)
    try:
        return label(order_id)
    except ActivityError:
        refund_flow.start_child(ch, _workflow_id=f"{wf.execution_id()}-refund").result()
        raise


@durable.workflow(name="r1.plain")
def plain(order_id: str) -> str:
    return label(order_id)


@durable.workflow(name="r1.waits", signals={"go": str})
def waits() -> str:
    return str(wf.wait_signal("go"))


class Killed(BaseException):  # noqa: N818 - a process dying
    pass


@pytest.fixture
def env() -> WorkflowEnvironment:
    calls.clear()
    broken["label"] = True
    return WorkflowEnvironment(durable)


def _snapshot(env: WorkflowEnvironment, pk: str) -> dict[str, Any]:
    return {d["id"]: d for d in env.store.query_partition(pk).docs}


def _failed_with_child(env: WorkflowEnvironment, eid: str) -> str:
    h = env.start(order_child, eid, _workflow_id=eid)
    env.run_until_idle()
    assert h.status() == "failed" and calls == ["charge", "refund"]
    assert env.handle(f"{eid}-refund").status() == "completed"
    return h.id


# --- promise 3: validate before the first write ----------------------------------------------


def test_a_refused_retry_has_already_deleted_the_child_it_would_forget(env: WorkflowEnvironment) -> None:
    """Admin._operate purged the finished children of the forgotten steps *before* commit()
    checked the documents it would write: a retry refused there ("cannot be stored") had deleted
    the compensation child already. A reason too long to record is now refused before anything
    (the same deletion on a conflict or a kill at the commit: the tests below)."""
    eid = _failed_with_child(env, "o-1")
    child_before = _snapshot(env, "o-1-refund")
    with pytest.raises(OperationRefused):
        # the op record cannot be stored (over the store's document limit): refused, "nothing written"
        Admin(env.engine).retry(eid, by="ops", reason="x" * (3 * 1024 * 1024))
    assert _snapshot(env, "o-1-refund") == child_before, "the refused retry deleted the child execution"


def test_a_purge_with_a_bad_by_deletes_then_raises(env: WorkflowEnvironment) -> None:
    """check_purge does not look at ``by``: the execution is deleted, then the tombstone cannot
    be written (bytes are not JSON) and a raw TypeError escapes; the purge left no record."""
    h = env.start(plain, "p-1", _workflow_id="p-1")
    env.run_until_idle()
    assert h.status() == "failed"
    before = _snapshot(env, h.id)
    env.clock.advance(10)
    raised: BaseException | None = None
    try:
        Admin(env.engine).purge(0, by=b"ops")  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - which one is judged below
        raised = exc
    assert _snapshot(env, h.id) == before, f"a purge with a bad input deleted the execution, then raised {raised!r}"
    assert isinstance(raised, OperationRefused), raised


@pytest.mark.parametrize(
    "call",
    [
        lambda a, e: a.retry(e, by=""),
        lambda a, e: a.retry(e, by="   "),
        lambda a, e: a.retry(e, by="ops", reason="x" * 5000),
    ],
    ids=["retry-by-empty", "retry-by-blank", "retry-reason-too-long"],
)
def test_retry_records_inputs_that_reset_refuses(env: WorkflowEnvironment, call: Any) -> None:
    """reset refuses an empty/blank ``by`` and a reason over 4096 characters (check_inputs);
    retry (and resume) only check the id, and record who='' or a 5000 character reason."""
    h = env.start(plain, "v-1", _workflow_id="v-1")
    env.run_until_idle()
    before = _snapshot(env, h.id)
    with pytest.raises(OperationRefused):
        call(Admin(env.engine), h.id)
    assert _snapshot(env, h.id) == before


# --- promise 3/4: crash-safe, nothing that ran is forgotten ----------------------------------


def test_a_retry_killed_at_its_commit_loses_the_forgotten_child_without_a_record(env: WorkflowEnvironment) -> None:
    """The child is purged (its own batches) before the parent's first batch; a kill there leaves
    the parent's old state (failed, no pending op, no record) but the child and its refund gone.
    The next retry then archives nothing of it: a refund that ran is forgotten."""
    eid = _failed_with_child(env, "o-2")
    real = env.store.batch

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        if pk == eid:
            raise Killed("the operator's process dies at the parent's commit")
        return real(pk, ops)

    env.store.batch = batch  # type: ignore[method-assign]
    with pytest.raises(Killed):
        Admin(env.engine).retry(eid, by="ops")
    env.store.batch = real  # type: ignore[method-assign]
    # old state or a recorded op: the child should still be there, or recorded somewhere
    broken["label"] = False
    Admin(env.engine).retry(eid, by="ops")
    env.run_until_idle()
    info = Admin(env.engine).describe(eid)
    kept = [(s.execution, s.name, s.value) for s in info.superseded if s.execution]
    assert kept == [("o-2-refund", "r1.refund", "refunded ch-o-2")], (
        f"the refund the child ran is recorded nowhere: superseded={kept}, "
        f"children={[o.get('forgotten_children') for o in info.operations]}"
    )


def test_a_purge_killed_after_its_deletes_leaves_no_record(env: WorkflowEnvironment) -> None:
    """The purge's record (tombstone) is a separate write after the last delete batch, and a
    store error there is only logged: the execution is gone and nothing says who purged it."""
    h = env.start(plain, "p-2", _workflow_id="p-2")
    env.run_until_idle()
    real = env.store.upsert

    def upsert(doc: dict[str, Any]) -> str:
        raise StoreUnavailable("the store went away after the purge's deletes")

    env.store.upsert = upsert  # type: ignore[method-assign]
    env.clock.advance(10)
    report = Admin(env.engine).purge(0, by="ops")
    env.store.upsert = real  # type: ignore[method-assign]
    assert report.purged == 1
    with pytest.raises(UnknownWorkflowError) as exc:
        Admin(env.engine).describe(h.id)
    assert "purged by ops" in str(exc.value), f"the purge is recorded nowhere: {exc.value}"


# --- promise 4: every operator action recorded -----------------------------------------------


def test_a_second_operators_cancel_is_not_recorded(env: WorkflowEnvironment) -> None:
    """engine.cancel returns True without writing when a cancel is already requested: the second
    operator's action (who, reason) is recorded nowhere, though it reports success."""
    h = env.start(waits, _workflow_id="c-1")
    env.run_until_idle()
    real = env.engine.dispatcher.send_drive
    env.engine.dispatcher.send_drive = lambda *a, **k: None  # type: ignore[method-assign]
    assert env.engine.cancel(h.id, by="alice", reason="duplicate") is True
    assert env.engine.cancel(h.id, by="bob", reason="fraud") is True
    env.engine.dispatcher.send_drive = real  # type: ignore[method-assign]
    ops = [(o["action"], o["by"], o["reason"]) for o in Admin(env.engine).describe(h.id).operations]
    assert ("cancel", "bob", "fraud") in ops, f"bob's cancel is not recorded: {ops}"


# --- promise 1: no message (or attempt) of the old run completes the re-run's step ------------

ADDR = {"to": "old street"}


@durable_activity(name="r1.ship")
def ship(addr: str) -> str:
    calls.append("ship " + addr)
    return "shipped to " + addr


@durable.workflow(name="r1.shipper")
def shipper() -> str:
    return ship(ADDR["to"])  # the address is what the operator fixes before the reset


def test_an_old_attempt_still_running_completes_the_reset_step(env: WorkflowEnvironment) -> None:
    """The token is checked only when an attempt *begins* (ActivityRunner.begin); its outcome is
    then written by drive(carry=...) on whatever marker holds that step number now. An attempt of
    the old run whose lease lapsed (a stalled worker) lets reset forget its step; the re-run takes
    step 1 with other arguments (new token), and when the stalled attempt finishes, its result
    (for the OLD address) is recorded as the re-run's step 1 and the recorded call never runs."""
    from celery_durable.engine.activities.delivery import Delivery

    ADDR["to"] = "old street"
    held: list[Any] = []
    real = env.dispatcher.handlers["activity"]

    def hold(req: Any) -> None:
        if req.name != "r1.ship":
            return real(req)
        if not held:  # a worker takes the first message and stalls in the call
            attempt, why = env.engine.activities.begin(
                req.execution_id, req.seq, req.run, delivery=Delivery.of_request(req)
            )
            assert attempt is not None, why
            held.append(attempt)
        else:  # the re-run's message waits in the queue
            held.append(req)

    env.dispatcher.handlers["activity"] = hold
    h = env.start(shipper, _workflow_id="s-1")
    env.run_until_idle()
    assert len(held) == 1
    env.engine.cancel(h.id, by="ops", reason="wrong address")
    env.run_until_idle()
    assert h.status() == "cancelled"
    env.clock.advance(env.engine.settings.lease_ttl + 1)  # the stalled worker's lease lapses
    ADDR["to"] = "new street"
    Admin(env.engine).reset(h.id, step=1, by="ops", reason="address fixed")
    env.run_until_idle()
    assert len(held) == 2, held  # the re-run sent ship("new street"), queued
    old = held[0]
    # the stalled worker finishes its (old) call and records it
    env.engine.activities.complete(old, env.engine.activities.result_doc(old, value="shipped to old street"))
    env.dispatcher.handlers["activity"] = real
    real(held[1])  # the re-run's own message is delivered at last
    env.run_until_idle()
    assert env.result(h) == "shipped to new street", "the old run's attempt completed the re-run's step"


# --- promise 3: a kill between the parent's commit and its child's cascade --------------------


@durable.workflow(name="r1.labeller")
def labeller(order_id: str) -> str:
    return label(order_id)


@durable.workflow(name="r1.parent")
def parent(order_id: str) -> str:
    return labeller.start_child(order_id, _workflow_id=f"{wf.execution_id()}-kid").result()


def test_a_retry_killed_before_it_reopens_the_failed_child_is_undone_by_recovery(env: WorkflowEnvironment) -> None:
    """A retry of a parent whose failed step is a failed child commits the parent (recorded,
    reopened, the child step re-armed) and only then retries the child (Admin._operate's
    ``rewrite.children`` loop). Killed in between, nothing records that the child is still to be
    retried: the recovery scan finds the child step due, the child failed, tells the parent the
    OLD failure, and the parent fails again; the operator's retry is silently undone."""
    h = env.start(parent, "k-1", _workflow_id="k-1")
    env.run_until_idle()
    assert h.status() == "failed" and env.handle("k-1-kid").status() == "failed"
    broken["label"] = False  # the printer is fixed: a clean retry ships
    real = env.store.batch

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        if pk == "k-1-kid":
            raise Killed("the operator's process dies after the parent's commit")
        return real(pk, ops)

    env.store.batch = batch  # type: ignore[method-assign]
    with pytest.raises(Killed):
        Admin(env.engine).retry(h.id, by="ops")
    env.store.batch = real  # type: ignore[method-assign]
    for _ in range(5):  # beat's recovery scans, as time goes on
        env.clock.advance(env.engine.settings.activity_queue_timeout + env.engine.settings.drive_timeout + 1)
        env.engine.recovery.scan()
        env.run_until_idle()
    assert h.status() == "completed", (
        f"the recorded retry was undone: parent {h.status()}, child {env.handle('k-1-kid').status()}"
    )


# --- promise 4: nothing that ran is forgotten ---------------------------------------------------


def test_a_retry_that_meets_a_conflict_records_nothing_of_the_child_it_deleted(env: WorkflowEnvironment) -> None:
    """No crash at all: the parent's exec changes between the retry's plan and its commit (the
    ConflictError _operate handles by planning again). The first round already purged the
    child; the second plan finds it gone ("already forgotten") and its record archives nothing
    of it: the refund that ran in the child is recorded nowhere."""
    from celery_durable.errors import ConflictError

    eid = _failed_with_child(env, "o-3")
    real, hit = env.store.batch, list[int]()

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        if pk == eid and not hit:
            hit.append(1)
            raise ConflictError("the exec changed meanwhile (a concurrent writer)")
        return real(pk, ops)

    env.store.batch = batch  # type: ignore[method-assign]
    broken["label"] = False
    Admin(env.engine).retry(eid, by="ops")
    env.store.batch = real  # type: ignore[method-assign]
    env.run_until_idle()
    assert hit and env.handle(eid).status() == "completed"
    info = Admin(env.engine).describe(eid)
    kept = [(s.execution, s.name, s.value) for s in info.superseded if s.execution]
    assert kept == [("o-3-refund", "r1.refund", "refunded ch-o-3")], (
        f"the child's refund is recorded nowhere: superseded={kept}, "
        f"children={[o.get('forgotten_children') for o in info.operations]}"
    )


@durable.workflow(name="r1.trip")
def trip(legs: int) -> str:
    with wf.Saga() as saga:
        for i in range(legs):
            charge(f"leg{i}")
            saga.add(refund, f"leg{i}")
        return label("trip")


def test_a_retry_forgetting_more_than_200_refunds_keeps_only_a_count_of_the_rest(env: WorkflowEnvironment) -> None:
    """oplog.archive keeps at most MAX_ENTRIES (200) steps per operation and counts the rest in
    ``forgotten_more``: 50 refunds that ran leave neither their step, name nor value anywhere
    (describe().superseded, show, --json, the UI all read the archive)."""
    h = env.start(trip, 250, _workflow_id="t-1")
    env.run_until_idle()
    assert h.status() == "failed" and calls.count("refund") == 250
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="ops")
    env.run_until_idle()
    assert h.status() == "completed"
    info = Admin(env.engine).describe(h.id)
    refunds = sorted(str(s.value) for s in info.superseded if s.name == "r1.refund" and s.state == "ok")
    missing = sorted({f"refunded leg{i}" for i in range(250)} - set(refunds))
    assert not missing, f"{len(missing)} refunds that ran are gone from the record (e.g. {missing[:3]})"


def test_resume_clears_the_live_lease_of_a_running_attempt(env: WorkflowEnvironment) -> None:
    """reset and retry refuse while a step's attempt is still running ("its outcome would land
    on whatever step the re-run records"); resume of a cancelled execution does not look: it
    re-arms the cancelled step with ``lease: None`` and sends it again, so a second attempt
    starts while the first (cancelled but still running, its lease live) has not ended: the
    activity runs twice at once, and whichever ends first completes the resumed step."""
    from celery_durable.engine.activities.delivery import Delivery

    ADDR["to"] = "old street"
    held: list[Any] = []
    real = env.dispatcher.handlers["activity"]

    def hold(req: Any) -> None:
        if req.name == "r1.ship" and not held:  # a worker takes it and is still in the call
            attempt, why = env.engine.activities.begin(
                req.execution_id, req.seq, req.run, delivery=Delivery.of_request(req)
            )
            assert attempt is not None, why
            held.append(attempt)
            return None
        return real(req)

    env.dispatcher.handlers["activity"] = hold
    h = env.start(shipper, _workflow_id="s-2")
    env.run_until_idle()
    env.engine.cancel(h.id, by="ops")
    env.run_until_idle()
    assert h.status() == "cancelled" and len(held) == 1 and calls == []
    try:
        Admin(env.engine).resume(h.id, by="ops")
    except OperationRefused:
        return  # refused while the attempt runs: what reset and retry do
    env.run_until_idle()
    assert calls == [], f"a second attempt ran while the first still held its live lease: {calls}"


def test_a_purge_cannot_record_why(env: WorkflowEnvironment) -> None:
    """Every operator action is recorded with who, when and *reason*: Admin.purge takes no
    ``reason`` (tombstone() has the field, nobody fills it; the CLI has no --reason)."""
    h = env.start(plain, "p-3", _workflow_id="p-3")
    env.run_until_idle()
    env.clock.advance(10)
    Admin(env.engine).purge(0, by="ops", reason="GDPR erasure request #77")  # type: ignore[call-arg]
    gone = env.store.read(h.id, "purged")
    assert gone is not None and gone.get("reason") == "GDPR erasure request #77", gone


def test_a_child_a_retry_deleted_answers_as_if_it_never_existed(env: WorkflowEnvironment) -> None:
    """A purged id says who purged it (oplog.unknown reads its tombstone); a child execution a
    retry forgot is deleted with no such record: ``describe``/``durable show`` of its id (the id
    the parent's step, logs and alerts name) answers "no execution", nothing pointing at the
    parent's retry that archived it."""
    eid = _failed_with_child(env, "o-4")
    broken["label"] = False
    Admin(env.engine).retry(eid, by="ops")
    env.run_until_idle()
    with pytest.raises(UnknownWorkflowError) as exc:
        Admin(env.engine).describe("o-4-refund")
    assert "o-4" in str(exc.value).replace("'o-4-refund'", ""), f"nothing says where it went: {exc.value}"


def test_a_cli_signal_whose_record_fails_is_delivered_unrecorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI (and the UI) deliver the signal, then record who sent it in a separate write
    (oplog.note); a store error (or a kill) between the two leaves a delivered signal with no
    record of the operator action: only a warning on stderr."""
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    import celery_durable.cli.commands as cli_mod
    from celery_durable.errors import DurableError

    env = WorkflowEnvironment(durable, store=durable.store)
    h = env.start(waits, _workflow_id="sig-1")
    env.run_until_idle()

    def note(*args: Any, **kwargs: Any) -> None:
        raise DurableError("the store went away after the signal was recorded")

    # raising=False: the fixed CLI makes no separate note write (nothing named note to fail)
    monkeypatch.setattr(cli_mod, "note", note, raising=False)
    out = CliRunner().invoke(
        celery_cli, ["-A", "tests.engine.test_operator_actions_breaks", "durable", "signal", h.id, "go", '"now"']
    )
    assert "delivered" in out.output, out.output
    env.run_until_idle()
    ops = [o["action"] for o in Admin(env.engine).describe(h.id).operations]
    assert "signal" in ops, f"the operator's signal is delivered but recorded nowhere: {ops}"


# --- promise 3: a purge killed between its batches ------------------------------------------

RAN: list[int] = []


@durable_activity(name="r1.step")
def step(i: int) -> int:
    RAN.append(i)
    return i


@durable.workflow(name="r1.long")
def long_(n: int) -> int:
    return sum(step(i) for i in range(n)) + len(label("x"))


def test_a_purge_killed_between_its_batches_leaves_a_history_a_retry_reruns(env: WorkflowEnvironment) -> None:
    """_purge_one deletes a partition in batches, the exec last ("purging": True on it, which
    nothing reads). Killed after its first batch, the execution looks like an ordinary failed one
    with part of its history gone: no tombstone, nothing in describe(), and nothing finishes the
    purge (the recovery scan, the driver and the admin calls ignore ``purging``). A retry of it
    then re-drives the cut history and runs again activities that had finished."""
    RAN.clear()
    h = env.start(long_, 150, _workflow_id="l-1")
    env.run_until_idle()
    assert h.status() == "failed" and len(RAN) == 150
    real, n = env.store.batch, [0]

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        n[0] += 1
        out = real(pk, ops)
        if n[0] == 1:
            raise Killed("the purging process dies after its first batch")
        return out

    env.store.batch = batch  # type: ignore[method-assign]
    env.clock.advance(10)
    with pytest.raises(Killed):
        Admin(env.engine).purge(0, by="ops")
    env.store.batch = real  # type: ignore[method-assign]
    RAN.clear()
    broken["label"] = False
    try:
        Admin(env.engine).retry(h.id, by="ops")
    except (OperationRefused, UnknownWorkflowError):
        pass  # refused, or the purge finished first: either keeps the promise
    env.run_until_idle()
    assert RAN == [], f"{len(RAN)} finished activities ran again on the half-purged history"


@durable.workflow(name="r1.fanout")
def fanout(n: int) -> int:
    return sum(wf.gather(*[step.start(i) for i in range(n)]))


def test_resume_of_a_cancelled_fan_out_wider_than_a_batch_is_impossible(env: WorkflowEnvironment) -> None:
    """pending_ops.commit refuses an op with more markers to re-arm than fit in one batch
    ("nothing was changed"), whatever the inputs: a cancelled execution that was waiting on 120
    activities can never be resumed, though resume's contract (and the CLI's) says it applies."""
    RAN.clear()
    real = env.dispatcher.handlers["activity"]
    env.dispatcher.handlers["activity"] = lambda req: None if req.name == "r1.step" else real(req)  # still queued
    h = env.start(fanout, 120, _workflow_id="f-1")
    env.run_until_idle()
    env.engine.cancel(h.id, by="ops")
    env.run_until_idle()
    assert h.status() == "cancelled"
    env.dispatcher.handlers["activity"] = real
    Admin(env.engine).resume(h.id, by="ops", reason="cancelled by mistake")
    env.run_until_idle()
    assert env.result(h) == sum(range(120))


# --- promise 4: prompts say what will be forgotten -------------------------------------------


@durable.workflow(name="r1.saga")
def saga_order(order_id: str) -> str:
    with wf.Saga() as saga:
        ch = charge(order_id)
        saga.add(refund, ch)
        return label(order_id)


def test_the_ui_retry_prompt_does_not_say_a_refund_already_ran(env: WorkflowEnvironment) -> None:
    """The CLI's retry prompt lists the steps it forgets, flagging "it RAN" (engine/admin/wording.py prompt);
    the UI's retry confirmation is a fixed "Retry from the failed step?": the operator clicking it
    is not told the refund that ran will be forgotten (issue 23 item 4: prompts say what will be
    forgotten and which compensations already ran)."""
    from starlette.testclient import TestClient

    from celery_durable.ui import create_app

    h = env.start(saga_order, "u-1", _workflow_id="u-1")
    env.run_until_idle()
    assert h.status() == "failed" and calls == ["charge", "refund"]
    token = "r1-token-0123456789abcdef"
    with TestClient(create_app(env.engine, token), follow_redirects=False) as client:
        assert client.post("/login", data={"token": token, "next": "/executions"}).status_code == 303
        page = client.get(f"/executions/{h.id}").text
    form = page.split('action="/actions/retry"', 1)[1].split(">", 1)[0]
    assert "r1.refund" in form, f"the UI's retry confirmation does not name what it forgets: {form.strip()}"


@durable.workflow(name="r1.helper", signals={"go": str})
def helper(order_id: str) -> str:
    return str(wf.wait_signal("go")) + order_id


@durable.workflow(name="r1.escalate")
def escalate(order_id: str) -> str:
    """On failure, asks a helper workflow (a child) before giving up; an operator cancels it."""
    try:
        return label(order_id)
    except ActivityError:
        try:
            helper.start_child(order_id, _workflow_id=f"{wf.execution_id()}-help").result()
        except Exception:  # noqa: BLE001 - the helper was cancelled: give up as before
            pass
        raise


def test_a_retry_deletes_the_record_of_an_operators_cancel_of_a_forgotten_child(env: WorkflowEnvironment) -> None:
    """An operator (alice) cancelled a child, with a reason; that child belongs to the steps a
    later retry of the parent forgets, so it is deleted, its ``op:`` documents with it: the
    parent's archive (oplog._child) keeps the child's steps and status, not who cancelled it,
    when or why. An operator action is recorded nowhere any more."""
    h = env.start(escalate, "e-1", _workflow_id="e-1")
    env.run_until_idle()
    kid = env.handle("e-1-help")
    assert kid.status() == "running"
    kid.cancel(by="alice", reason="nobody answers the helpdesk")
    env.run_until_idle()
    assert kid.status() == "cancelled" and h.status() == "failed"
    assert [o["by"] for o in Admin(env.engine).describe(kid.id).operations] == ["alice"]
    broken["label"] = False
    Admin(env.engine).retry(h.id, by="bob")
    env.run_until_idle()
    assert h.status() == "completed"
    text = repr(Admin(env.engine).describe(h.id).operations)
    assert "alice" in text and "nobody answers the helpdesk" in text, f"alice's cancel is recorded nowhere: {text}"


@pytest.mark.parametrize("by,reason", [("", None), ("ops", "x" * 100_000)], ids=["by-empty", "reason-100k"])
def test_cancel_records_inputs_that_reset_refuses(env: WorkflowEnvironment, by: str, reason: str | None) -> None:
    """engine.cancel (the handle's, the CLI's, the UI's) checks only that ``by``/``reason`` are
    strings (oplog.cancel_ops): an empty ``by`` (who: nobody) or a 100,000 character reason is
    recorded, where reset refuses both before writing (pending_ops.check_inputs)."""
    h = env.start(waits, _workflow_id=f"cv-{len(by)}")
    env.run_until_idle()
    before = _snapshot(env, h.id)
    with pytest.raises((OperationRefused, ValueError)):
        env.engine.cancel(h.id, by=by, reason=reason)
    assert _snapshot(env, h.id) == before


def test_a_second_purge_of_a_reused_id_erases_the_record_of_the_first(env: WorkflowEnvironment) -> None:
    """The purge record is one document with a fixed id (``purged``) in the emptied partition: an
    id started again after a purge and purged again deletes the first tombstone with the rest,
    then writes its own; who purged the first execution, and when, is recorded nowhere."""
    h = env.start(plain, "r-1", _workflow_id="r-1")
    env.run_until_idle()
    env.clock.advance(10)
    assert Admin(env.engine).purge(0, by="alice").purged == 1
    assert (env.store.read("r-1", "purged") or {}).get("by") == "alice"
    h = env.start(plain, "r-1", _workflow_id="r-1")  # the id is used again
    env.run_until_idle()
    assert h.status() == "failed"
    env.clock.advance(10)
    assert Admin(env.engine).purge(0, by="bob").purged == 1
    records = [d for d in env.store.query_partition("r-1").docs if d.get("action") == "purge"]
    assert sorted(str(d.get("by")) for d in records) == ["alice", "bob"], f"purge records left: {records}"
