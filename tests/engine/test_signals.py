"""The library's own signals fire with their documented arguments; counters count events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import signals as sig
from celery_durable import workflow as wf
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("signal-tests", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="sig.ok")
def ok(x: int) -> int:
    return x


@durable_activity(name="sig.bad")
def bad() -> int:
    raise KeyError("missing")


@durable.workflow(name="sig.flow", signals={"go": int})
def flow() -> int:
    wf.sleep(timedelta(minutes=5))
    n = wf.wait_signal("go")
    try:
        bad()
    except Exception:
        pass
    return ok(n)


def test_signals_fire_with_documented_arguments() -> None:
    seen: list[tuple[str, Any, dict[str, Any]]] = []

    def receiver(name: str):  # type: ignore[no-untyped-def]
        def on(sender: Any = None, **kw: Any) -> None:
            kw.pop("signal", None)
            seen.append((name, sender, kw))

        return on

    names = [
        "workflow_started",
        "workflow_suspended",
        "workflow_completed",
        "activity_completed",
        "activity_failed",
        "timer_fired",
        "signal_received",
        "signal_ignored",
    ]
    handlers = {n: receiver(n) for n in names}
    for n, fn in handlers.items():
        getattr(sig, n).connect(fn, weak=False)
    try:
        env = WorkflowEnvironment(durable)
        h = env.start(flow)
        env.skip_to_next_timer()
        assert env.engine.signal(h.id, "go", 7) is True
        assert env.result(h) == 7
        assert env.engine.signal(h.id, "go", 8) is False  # the execution has ended
    finally:
        for n, fn in handlers.items():
            getattr(sig, n).disconnect(fn)
    kinds = [s[0] for s in seen]
    assert kinds[0] == "workflow_started" and kinds[-2:] == ["workflow_completed", "signal_ignored"]
    started = seen[0]
    assert started[1] == "sig.flow" and started[2] == {"execution_id": h.id, "workflow": "sig.flow"}
    fired = next(s for s in seen if s[0] == "timer_fired")
    assert fired[2]["execution_id"] == h.id and fired[2]["seq"] == 1 and fired[2]["lateness"] >= 0
    failed = next(s for s in seen if s[0] == "activity_failed")
    assert failed[1] == "sig.bad" and failed[2]["attempts"] == 1
    ignored = next(s for s in seen if s[0] == "signal_ignored")
    assert ignored[2]["name"] == "go" and ignored[2]["reason"] == "completed"
    counts = env.engine.counters.snapshot()
    assert counts["workflow_completed"] == 1 and counts["activity_completed"] == 1 and counts["activity_failed"] == 1
