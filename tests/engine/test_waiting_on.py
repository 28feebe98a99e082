"""What a running execution waits on (issue 25: the list's "waiting on"): each suspending commit
records the awaited steps in the exec (``waiting``: kind, name, a timer's or a signal wait's
deadline, a child's id; at most 5 named), listed by ``durable list`` and the UI without reading
any step document; gone once the execution ends."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.drive.carried import MAX_WAITING
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("waiting-on", set_as_current=False), store="memory://")


@durable.workflow(name="wo.kid", signals={"go": int})
def kid() -> int:
    return int(wf.wait_signal("go"))


@durable.workflow(name="wo.flow", signals={"ok": bool})
def flow() -> int:
    wf.sleep(timedelta(hours=1))
    wf.wait_signal("ok", timeout=timedelta(minutes=30))
    futures = [kid.start_child(_workflow_id=f"{wf.execution_id()}-k{i}") for i in range(MAX_WAITING + 2)]
    return sum(wf.gather(*futures))


def _waiting(env: WorkflowEnvironment, eid: str) -> list[dict[str, object]]:
    ex = env.engine.read_exec(eid)
    (summary,) = [s for s in Admin(env.engine).executions(limit=50).executions if s.id == eid]
    assert list(summary.waiting) == list(ex.get("waiting") or [])
    return list(ex.get("waiting") or [])


def test_the_exec_says_what_it_waits_on_at_each_suspension() -> None:
    env = WorkflowEnvironment(durable)
    start = env.clock.now()
    h = env.start(flow)
    (timer,) = _waiting(env, h.id)
    assert timer["kind"] == "timer" and timer["seq"] == 1 and "name" not in timer
    assert abs(float(timer["until"]) - (start + 3600)) < 5  # type: ignore[arg-type]
    env.skip_to_next_timer()
    (wait,) = _waiting(env, h.id)
    assert (wait["kind"], wait["name"], wait["seq"]) == ("signal", "ok", 2)
    assert float(wait["until"]) > float(timer["until"])  # type: ignore[arg-type]
    env.signal(h, "ok", True)
    kids = _waiting(env, h.id)
    assert [k.get("kind") for k in kids[:MAX_WAITING]] == ["child"] * MAX_WAITING
    assert kids[0]["child"] == f"{h.id}-k0" and kids[0]["name"] == "wo.kid"
    assert kids[-1] == {"more": 2}
    for i in range(MAX_WAITING + 2):
        env.signal(env.handle(f"{h.id}-k{i}"), "go", i)
    assert env.result(h) == sum(range(MAX_WAITING + 2))
    assert _waiting(env, h.id) == []
