"""Adversarial review r4 of issue 23 (withdrawing a parent's cancel): each test FAILS on the code
it was written against and passes once the promise it names holds."""

from __future__ import annotations

from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import WorkflowCancelledError
from tests.engine.inprocess import InProcess


def _parent_failing_its_compensation(env: InProcess, fixed: dict[str, bool]) -> None:
    """``P`` gathers two children (each sleeps an hour); on a cancel it compensates with ``undo``
    (step 3), which fails until ``fixed["undo"]``. Cancelled by ``ops``, ``P`` ends FAILED in its
    compensation (``cancel_requested`` kept); its cancel point is step 2, the cascade cancelled
    both children (``cancelled_by_parent``): step 1 got the cancel's own outcome, step 2 the
    second child's cancelled end, recorded after it."""

    @env.activity
    def undo(x: str) -> str:
        if not fixed["undo"]:
            raise RuntimeError("undo service down")
        return x

    def kid(k: int) -> str:
        wf.sleep(3600)
        return f"kid{k}"

    kid_def = env.workflow(kid)

    def parent() -> list[str]:
        ctx = require_context("child")
        futures = [ctx.start_child(kid_def, (k,), {}, None) for k in range(2)]
        try:
            return [str(f.result()) for f in futures]
        except WorkflowCancelledError:
            undo("refund")
            raise

    env.start(env.workflow(parent), wid="P")
    env.engine.cancel("P", by="ops")
    env.run()
    env.finish(rounds=2)
    assert [env.status(k) for k in ("P", "P-c1", "P-c2")] == ["failed", "cancelled", "cancelled"]
    assert all(env.ex(k).get("cancelled_by_parent") for k in ("P-c1", "P-c2"))


def test_reset_of_a_parent_that_failed_compensating_keeps_the_cascade_of_the_cancel_it_withdraws() -> None:
    """Promise "withdrawing a cancel withdraws its cascade" (docs/architecture.md §10: "A resume or
    reset that reopens the parent ... arms again, and reopens, the children whose cancelled end it
    recorded"). bob resets ``P`` to step 3 (the step after its cancel point: allowed), which
    withdraws its cancel (``cancel_requested`` cleared). But reset.plan_reset computes the
    cascade (``cascaded``) and ``rearm_waiting_children`` only when the parent's status is
    ``cancelled``: ``P`` ended ``failed`` (in its compensation), so step 2 keeps ``P-c2``'s
    cancelled end, recorded as a plain failure. The re-run, without the cancel, fails with
    ChildWorkflowError ("child 'P-c2' was cancelled") on the cancel bob withdrew; the same reset
    of a ``P`` whose compensation succeeded completes (test_cancel_cascade)."""
    env = InProcess(step_time=1.0)
    fixed = {"undo": False}
    _parent_failing_its_compensation(env, fixed)
    fixed["undo"] = True
    Admin(env.engine).reset("P", 3, by="bob")
    env.finish()
    error: Any = env.ex("P").get("error") or {}
    assert (env.status("P"), env.ex("P").get("result")) == ("completed", ["kid0", "kid1"]), error.get("message")
