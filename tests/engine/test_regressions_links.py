"""Regressions of issue 10 in signals, children and scans (bugs 7, 8, 10, 11).

Each test adapts a reproducer from ``shared/repro/core`` and failed on the code before the fix.

Signal semantics these tests pin down (see ``Signals.signal``):

* a value is recorded atomically with the execution's state (one batch, conditional on the exec
  etag), so it is either refused or recorded where a run will consume it;
* each wait consumes the next *valid* value of its name, validated where it is consumed; an
  invalid value is recorded as rejected and the wait goes on; the others stay for later waits;
* a value for a name the run never waited for is carried over to the next run
  (continue-as-new), never pruned with the old run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel

from celery_durable import workflow as wf
from celery_durable.engine import Engine, Registry
from celery_durable.engine.registry import WorkflowDef
from celery_durable.errors import PayloadValidationError, WorkflowCancelledError
from celery_durable.stores.base import strip_reserved
from celery_durable.stores.memory import MemoryStore
from tests.engine.inprocess import InProcess, parent_and_child


class Env(InProcess):
    """One in-process worker over a store, recording the engine's events."""

    def __init__(self, store: MemoryStore | None = None, registry: Registry | None = None) -> None:
        super().__init__(store, registry)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.engine.subscribe(lambda event, **kw: self.events.append((event, kw)))


class Approval(BaseModel):
    ok: bool
    by: str


# --- bug 7: a signal racing continue-as-new ---------------------------------------------------


def test_signal_racing_continue_as_new_is_delivered_to_the_next_run() -> None:
    env = Env()
    seen: list[tuple[int, int]] = []

    def loop(n: int) -> int:
        v = wf.wait_signal("tick", int)
        seen.append((n, v))
        if n == 1:
            return int(v)
        wf.continue_as_new(n + 1)
        return -1

    eid = env.start(env.workflow(loop, signals={"tick": int}), 0, wid="L")
    assert env.engine.signal(eid, "tick", 1) is True  # recorded, not consumed yet

    # the second sender is preempted right after reading the exec (run 0) ...
    paused, go = threading.Event(), threading.Event()
    real_read = env.engine.read_exec

    def slow_read(x: str) -> dict[str, Any]:
        doc = real_read(x)
        if threading.current_thread().name == "sender2" and not paused.is_set():
            paused.set()
            assert go.wait(10)
        return doc

    env.engine.read_exec = slow_read  # type: ignore[method-assign]
    out: dict[str, bool] = {}
    t = threading.Thread(target=lambda: out.setdefault("ok", env.engine.signal(eid, "tick", 2)), name="sender2")
    t.start()
    assert paused.wait(10)
    env.worker.run()  # ... meanwhile run 0 takes tick=1, continues as new (run 1) and prunes run 0
    assert env.ex(eid)["run"] == 1
    go.set()
    t.join(10)
    env.worker.run()

    ex = env.ex(eid)
    assert out["ok"] is True
    assert (ex["status"], ex["result"]) == ("completed", 2), ex
    assert seen[-1] == (1, 2)


def test_value_for_a_name_the_run_never_waited_for_carries_over() -> None:
    env = Env()

    def two_phase(n: int) -> str:
        if n == 0:
            first = wf.wait_signal("a", int)
            wf.continue_as_new(first)
            return "unreachable"
        return f"{n}:{wf.wait_signal('b', int)}"

    eid = env.start(env.workflow(two_phase, signals={"a": int, "b": int}), 0, wid="C")
    # both values are sent while run 0 waits for "a": "b" belongs to whichever run waits for it
    assert env.engine.signal(eid, "b", 7) is True
    assert env.engine.signal(eid, "a", 5) is True
    env.worker.run()
    ex = env.ex(eid)
    assert (ex["status"], ex["run"], ex["result"]) == ("completed", 1, "5:7"), ex


# --- bug 11: validate where the value is consumed ----------------------------------------------


def approve(x: int) -> str:
    a = wf.wait_signal("approval")
    return f"{a.ok} by {a.by}"


def test_bad_value_from_a_sender_without_the_workflow_is_rejected_and_the_wait_goes_on() -> None:
    env = Env()
    eid = env.start(env.workflow(approve, signals={"approval": Approval}), 1)
    sender = Engine(env.store, env.dispatcher, Registry(), clock=env.clock)  # a webhook process

    assert sender.signal(eid, "approval", {"ok": "perhaps"}) is True  # it cannot tell: recorded
    env.worker.run()
    assert env.ex(eid)["status"] == "running"  # not failed: the value was rejected
    docs = env.store.query_partition(eid).docs
    rejected = [d for d in docs if d.get("type") == "signal_rejected"]
    assert len(rejected) == 1 and rejected[0]["name"] == "approval", docs
    assert rejected[0]["value"] == {"ok": "perhaps"} and "ok" in rejected[0]["error"]["message"]
    assert [kw for e, kw in env.events if e == "signal_rejected"] == [
        {"execution_id": eid, "name": "approval", "reason": rejected[0]["error"]["message"]}
    ]

    assert sender.signal(eid, "approval", {"ok": True, "by": "ops"}) is True  # the corrected value
    env.worker.run()
    ex = env.ex(eid)
    assert (ex["status"], ex["result"]) == ("completed", "True by ops"), ex


def test_sender_that_knows_the_type_still_refuses_a_bad_value_early() -> None:
    env = Env()
    eid = env.start(env.workflow(approve, signals={"approval": Approval}), 1)
    with pytest.raises(PayloadValidationError):
        env.engine.signal(eid, "approval", {"ok": "perhaps"})
    assert not [d for d in env.store.query_partition(eid).docs if d.get("name") == "approval" and "value" in d]


def test_undeclared_signal_name_is_refused_by_any_sender() -> None:
    env = Env()
    eid = env.start(env.workflow(approve, signals={"approval": Approval}), 1)
    assert env.ex(eid)["signals"] == ["approval"]  # the starter recorded the declared names
    sender = Engine(env.store, env.dispatcher, Registry(), clock=env.clock)
    with pytest.raises(PayloadValidationError, match="approvel"):
        sender.signal(eid, "approvel", {"ok": True, "by": "typo"})
    assert not [d for d in env.store.query_partition(eid).docs if d.get("name") == "approvel"]


def test_the_wait_takes_the_first_valid_value_after_an_earlier_invalid_one() -> None:
    env = Env()
    d = env.workflow(approve, signals={"approval": Approval})
    eid, _ = env.engine.start(d, (1,), {}, workflow_id="F")  # not driven yet
    sender = Engine(env.store, env.dispatcher, Registry(), clock=env.clock)
    assert sender.signal(eid, "approval", {"by": "nobody"}) is True
    assert sender.signal(eid, "approval", {"ok": False, "by": "second"}) is True
    assert sender.signal(eid, "approval", {"ok": True, "by": "third"}) is True  # valid, but not first
    env.worker.run()
    assert env.ex(eid)["result"] == "False by second"
    kinds = sorted(d["type"] for d in env.store.query_partition(eid).docs if d["id"].startswith("sgx:"))
    assert kinds == ["signal_consumed", "signal_rejected"]  # the third stays for a later wait
    assert env.engine.signal(eid, "approval", Approval(ok=True, by="late")) is False  # completed


# --- bug 8: a cancelled parent's never-created child --------------------------------------------


def test_recovery_never_creates_the_child_of_a_cancelled_parent() -> None:
    env = Env()
    side_effects: list[str] = []
    pdef = parent_and_child(env, side_effects)
    real = env.engine.children.start_child
    env.engine.children.start_child = lambda req: False  # type: ignore[method-assign,assignment,return-value]
    eid = env.start(pdef, "o-9", wid="P")  # the worker died before creating the child
    env.engine.children.start_child = real  # type: ignore[method-assign]
    assert env.store.read("P-c1", "exec") is None
    assert env.engine.cancel(eid) is True
    env.worker.run()
    assert env.ex(eid)["status"] == "cancelled"

    env.clock.t += 400  # > activity_queue_timeout: beat's recovery scan finds the child step due
    env.engine.recovery.scan()
    env.worker.run()
    child = env.store.read("P-c1", "exec")  # at most the cancel's fence of the id: never run
    assert child is None or (child["status"] == "cancelled" and child.get("fence") and not child["drives"]), child
    assert side_effects == []
    marker = env.store.read(eid, "s:000001")
    assert marker is not None and marker.get("due_kind") is None  # out of the scans for good


def test_cancel_racing_the_childs_creation_still_cancels_it() -> None:
    env = Env()
    side_effects: list[str] = []
    pdef = parent_and_child(env, side_effects)
    real_create = env.engine.create_execution

    def create_after_the_cancel(workflow: str, payload: Any, eid: str, parent: Any, **fields: Any) -> bool:
        if eid == "P-c1":  # the parent's cancel is delivered between the creator's checks and its create
            env.engine.cancel("P")
            env.engine.drive("P")
        return real_create(workflow, payload, eid, parent, **fields)

    env.engine.create_execution = create_after_the_cancel  # type: ignore[method-assign]
    eid, _ = env.engine.start(pdef, ("o-1",), {}, workflow_id="P")
    env.worker.run()
    assert env.ex(eid)["status"] == "cancelled"
    child = env.store.read("P-c1", "exec")
    assert child is not None and child["status"] == "cancelled", child
    assert side_effects == []


# --- bug 10: malformed documents fail their own execution only ----------------------------------


def _noop_flow(env: Env) -> WorkflowDef:
    @env.activity
    def noop(x: int) -> int:
        return x

    def flow(x: int) -> int:
        return int(noop(x))

    return env.workflow(flow)


def _corrupt(env: Env, pk: str, doc_id: str, **fields: Any) -> None:
    doc = env.store.read(pk, doc_id)
    assert doc is not None
    env.store.replace(strip_reserved(doc) | fields, doc["_etag"])


def test_malformed_exec_fails_its_execution_with_a_clear_error() -> None:
    env = Env()
    d = _noop_flow(env)
    eid, _ = env.engine.start(d, (1,), {}, workflow_id="bad-lease")
    env.dispatcher.queue.clear()
    _corrupt(env, eid, "exec", lease="worker-7")
    assert env.engine.drive(eid) == "failed"
    ex = env.ex(eid)
    assert ex["status"] == "failed" and ex["error"]["type"] == "CorruptDocument", ex
    assert "lease" in ex["error"]["message"]


def test_malformed_marker_fails_only_its_execution_and_recovery_goes_on() -> None:
    env = Env()
    d = _noop_flow(env)
    for wid in ("a-bad", "b-good"):
        env.engine.start(d, (2,), {}, workflow_id=wid)
        env.dispatcher.run_some(1)
        env.dispatcher.queue.clear()  # the drive ran, the activity message was lost
    _corrupt(env, "a-bad", "s:000001", input="garbage")
    env.clock.t += 400
    report = env.engine.recovery.scan()
    assert report.errors == 1, report
    assert [r.execution_id for k, r in env.dispatcher.queue if k == "activity"] == ["b-good"]
    bad = env.ex("a-bad")
    assert bad["status"] == "failed" and bad["error"]["type"] == "CorruptDocument", bad
    env.worker.run()
    assert env.ex("b-good")["status"] == "completed"
    # the failed execution left the scans: the next scan has nothing to report
    env.clock.t += 400
    assert env.engine.recovery.scan().errors == 0


def test_clock_scan_goes_on_past_a_malformed_clock() -> None:
    env = Env()

    def sleeper(x: int) -> int:
        wf.sleep(60)
        return x

    d = env.workflow(sleeper)
    env.start(d, 1, wid="c-bad")
    env.start(d, 2, wid="c-good")
    _corrupt(env, "c-bad", "s:000001", fire_at="soon")
    env.clock.t += 120
    assert env.engine.timers.fire_due_clocks() == 1
    env.worker.run()
    assert env.ex("c-good")["status"] == "completed"
    bad = env.ex("c-bad")
    assert bad["status"] == "failed" and bad["error"]["type"] == "CorruptDocument", bad


def test_foreign_due_document_does_not_abort_the_scans() -> None:
    env = Env()
    d = _noop_flow(env)
    env.engine.start(d, (3,), {}, workflow_id="z-good")
    env.dispatcher.run_some(1)
    env.dispatcher.queue.clear()
    # someone else's document, due in our scans, with an id the engine does not know
    env.store.create({"pk": "foreign", "id": "not-a-step", "due_kind": "activity", "due_at": 0.0})
    env.store.create({"pk": "foreign", "id": "also-not", "due_kind": "clock", "due_at": 0.0})
    env.clock.t += 400
    env.engine.timers.fire_due_clocks()
    env.engine.recovery.scan()
    assert [r.execution_id for k, r in env.dispatcher.queue if k == "activity"] == ["z-good"]


def test_rejection_fires_the_library_signal() -> None:
    from celery_durable import signals as sig
    from celery_durable.glue.hook_receivers import forward_event

    got: list[dict[str, Any]] = []

    def on_rejected(sender: Any = None, **kw: Any) -> None:
        kw.pop("signal", None)
        got.append(kw)

    env = Env()
    env.engine.subscribe(forward_event)
    sig.signal_rejected.connect(on_rejected, weak=False)
    try:
        eid = env.start(env.workflow(approve, signals={"approval": Approval}), 1)
        Engine(env.store, env.dispatcher, Registry(), clock=env.clock).signal(eid, "approval", 42)
        env.worker.run()
    finally:
        sig.signal_rejected.disconnect(on_rejected)
    assert len(got) == 1 and got[0]["execution_id"] == eid and got[0]["name"] == "approval", got


def test_value_sent_after_the_timeout_fired_is_kept_for_the_next_run() -> None:
    env = Env()

    def patient(n: int) -> str:
        try:
            v = wf.wait_signal("tick", int, timeout=60)
        except Exception as exc:  # DurableTimeoutError
            if n == 0:
                wf.continue_as_new(1)
            return type(exc).__name__
        return f"{n}:{v}"

    d = env.workflow(patient, signals={"tick": int})
    eid = env.start(d, 0, wid="T")
    env.clock.t += 61
    # another worker holds the exec lease: the timer's firing is only recorded, not yet decided
    ex = env.store.read(eid, "exec")
    assert ex is not None
    lease = {"holder": "someone-else", "expires": env.clock.t + 30}
    env.store.replace(strip_reserved(ex) | {"lease": lease}, ex["_etag"])
    assert env.engine.timers.fire_due_clocks() == 1
    assert env.engine.signal(eid, "tick", 9) is True  # after the timer fired: the timeout wins run 0
    ex = env.store.read(eid, "exec")
    assert ex is not None
    env.store.replace(strip_reserved(ex) | {"lease": None}, ex["_etag"])
    env.engine.drive(eid)
    env.worker.run()
    ex = env.ex(eid)
    assert (ex["status"], ex["run"], ex["result"]) == ("completed", 1, "1:9"), ex


def test_waiting_for_an_undeclared_name_fails_clearly() -> None:
    env = Env()

    def typo() -> int:
        return int(wf.wait_signal("aproval", int))

    eid = env.start(env.workflow(typo, signals={"approval": int}))
    ex = env.ex(eid)
    assert ex["status"] == "failed" and ex["error"]["type"] == "ConfigurationError", ex


def test_cancel_while_waiting_for_a_signal_ends_cancelled() -> None:
    """Found by the read-model work: the cancelled outcome of a signal wait must be a valid document."""
    env = Env()
    seen: list[str] = []

    def waits(x: int) -> str:
        try:
            return str(wf.wait_signal("go", int))
        except WorkflowCancelledError:
            seen.append("cancelled")
            raise

    definition = env.registry.add_workflow("waits", waits)
    eid, _ = env.engine.start(definition, (1,), {}, workflow_id="W-cancel-sig")
    env.worker.run()
    assert env.engine.read_exec(eid)["status"] == "running"
    assert env.engine.cancel(eid)
    env.worker.run()
    ex = env.engine.read_exec(eid)
    assert ex["status"] == "cancelled", ex.get("error")
    assert seen == ["cancelled"]
    # a late signal is refused and changes nothing
    assert env.engine.signal(eid, "go", 5) is False
    env.worker.run()
    assert env.engine.read_exec(eid)["status"] == "cancelled"
