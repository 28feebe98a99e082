"""An operation's recorded re-arm survives the recovery scan settling a marker meanwhile (sim seed 401).

The scan settles a marker (due None) when it read the step's result; on a view read before the
op's first batch deleted that result, it settles the marker after it. The finisher then applied
the op's re-arm, recorded as a diff of the marker the op read: a cancelled step's marker still
due 'activity' had no due change recorded, so it was left with nothing due and no result.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.pending_ops import PENDING
from celery_durable.engine.documents.model import settled
from celery_durable.stores.base import Op
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("pending-rearm-race", set_as_current=False)
durable = Durable(app, store="memory://")
N = 150  # a resume of them spans several batches (100 operations each): a recorded op


@durable_activity(name="prr.ok")
def ok(i: int) -> int:
    return i


@durable.workflow(name="prr.fanout")
def fanout(n: int) -> int:
    return sum(wf.gather(*[ok.start(i) for i in range(n)]))


class Killed(BaseException):  # noqa: N818 - a process dying, like SystemExit
    pass


def test_a_marker_settled_between_the_ops_batches_is_armed_again_by_the_finisher() -> None:
    env = WorkflowEnvironment(durable)
    real_send = env.dispatcher.handlers["activity"]
    env.dispatcher.handlers["activity"] = lambda req: None  # queued, never begun
    h = env.start(fanout, N)
    env.run_until_idle()
    env.cancel(h)
    env.run_until_idle()
    assert h.status() == "cancelled"
    store = env.store
    real_batch = store.batch

    def dies_after_first(pk: str, ops: Sequence[Op]) -> list[str | None]:
        real_batch(pk, ops)
        raise Killed("the operator died after its first batch")

    store.batch = dies_after_first  # type: ignore[method-assign]
    try:
        Admin(env.engine).resume(h.id, by="ops")
    except Killed:
        pass
    store.batch = real_batch  # type: ignore[method-assign]
    docs = {d["id"]: d for d in store.query_partition(h.id).docs}
    assert isinstance(docs["exec"].get(PENDING), dict), "the resume should be recorded, half done"
    markers = [d for d in docs.values() if d.get("type") == "step"]
    # the scan, on its stale view (the result still there), settles every marker
    for m in markers:
        store.replace(settled(m), m["_etag"])
    env.dispatcher.handlers["activity"] = real_send
    env.engine.drive(h.id)  # the driver finishes the recorded op first
    env.run_until_idle()
    # the dead operator's messages are lost: the scan sends again whatever is due, nothing else
    now = {d["id"]: d for d in store.query_partition(h.id).docs}
    stuck = [i for i, d in now.items() if d.get("type") == "step" and not d.get("due_kind") and "r:" + i[2:] not in now]
    assert not stuck, f"steps with no result and nothing due: {stuck[:3]}"
    env.clock.advance(env.engine.settings.activity_queue_timeout + 1)
    env.engine.recovery.scan()
    env.run_until_idle()
    assert h.status() == "completed"
    assert env.result(h) == sum(range(N))
