"""A purge killed (or failing) between its batches is recorded and finished, never re-run (engine/admin/purge.py).

Seeded: executions of random sizes, a kill or a store error at a random batch of the purge, then
a random one of those who touch the execution next (the recovery scan, the driver, describe, retry,
resume, reset, another purge). Afterwards either the execution is as it was (the first batch did
not commit) or it is gone with its purge's record (who, why), and no finished activity ran again."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.errors import StoreUnavailable, UnknownWorkflowError
from celery_durable.stores.base import Op
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("purging-tests", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
RAN: list[int] = []
BROKEN = {"last": True}


@durable_activity(name="pg.step")
def step(i: int) -> int:
    RAN.append(i)
    return i


@durable_activity(name="pg.last")
def last() -> int:
    if BROKEN["last"]:
        raise NonRetryableError("broken")
    return 0


@durable.workflow(name="pg.long")
def long_(n: int) -> int:
    return sum(step(i) for i in range(n)) + last()


class Killed(BaseException):  # noqa: N818 - a process dying
    pass


def _touch(env: WorkflowEnvironment, how: str, eid: str) -> None:
    admin = Admin(env.engine)
    try:
        if how == "scan":
            env.clock.advance(env.engine.settings.drive_timeout + 1)
            env.engine.recovery.scan()  # what beat's periodic scan does
        elif how == "describe":  # the CLI's show, the UI: a recorded purge is finished, not shown cut
            admin.describe(eid)
        elif how == "drive":
            env.engine.drive(eid)
        elif how == "retry":
            admin.retry(eid, by="ops2")
        elif how == "resume":
            admin.resume(eid, by="ops2")
        elif how == "reset":
            admin.reset(eid, 1, by="ops2")
        else:
            admin.purge(0, by="ops2")
    except (OperationRefused, UnknownWorkflowError):
        pass
    env.run_until_idle()


@pytest.mark.parametrize("seed", range(70))
def test_a_purge_cut_at_any_batch_is_recorded_and_finished_by_whoever_comes_next(seed: int) -> None:
    rnd = random.Random(seed)
    env = WorkflowEnvironment(durable)
    RAN.clear()
    BROKEN["last"] = True
    n = rnd.choice([0, 3, 60, 120, 120, 160, 160])
    eid = f"pg-{seed}"
    h = env.start(long_, n, _workflow_id=eid)
    env.run_until_idle()
    assert h.status() == "failed"
    before = {d["id"]: d for d in env.store.query_partition(eid).docs}
    batches = -(-(len(before) + 1) // (env.store.max_batch_ops - 1))
    cut, fault = rnd.randint(1, batches), rnd.choice(["kill", "error"])
    real, count = env.store.batch, [0]

    def batch(pk: str, ops: Sequence[Op]) -> list[str | None]:
        count[0] += 1
        if count[0] == cut and fault == "error":
            raise StoreUnavailable("the store went away")  # this batch not applied
        out = real(pk, ops)
        if count[0] == cut and fault == "kill":
            raise Killed("the purging process dies after this batch")
        return out

    env.store.batch = batch  # type: ignore[method-assign]
    env.clock.advance(10)
    with pytest.raises((Killed, StoreUnavailable)):
        Admin(env.engine).purge(0, by="ops", reason=f"seed {seed}")
    env.store.batch = real  # type: ignore[method-assign]
    RAN.clear()
    BROKEN["last"] = False
    how = ["scan", "drive", "retry", "resume", "reset", "purge", "describe"][seed % 7]  # each, at every kind of cut
    if cut == 1 and fault == "error":  # nothing was written: the old state, whatever comes next
        assert {d["id"]: d for d in env.store.query_partition(eid).docs} == before
        return
    _touch(env, how, eid)
    left = env.store.query_partition(eid).docs
    assert [d["id"] for d in left] == ["purged"], f"{how}: left {sorted(d['id'] for d in left)[:5]}"
    assert left[0]["by"] == "ops" and left[0]["reason"] == f"seed {seed}" and left[0]["documents"] == len(before)
    assert RAN == [], f"{how}: {len(RAN)} finished activities ran again on the half-purged history"
    with pytest.raises(UnknownWorkflowError, match="purged by ops"):
        Admin(env.engine).describe(eid)


def test_a_purged_id_used_again_keeps_every_purge_record_and_quotes_the_last() -> None:
    env = WorkflowEnvironment(durable)
    BROKEN["last"] = True
    for who in ("alice", "bob", "carol"):
        env.start(long_, 2, _workflow_id="again")
        env.run_until_idle()
        env.clock.advance(10)
        assert Admin(env.engine).purge(0, by=who).purged == 1
    ids = sorted((d["id"], d["by"]) for d in env.store.query_partition("again").docs)
    assert ids == [("purged", "alice"), ("purged:2", "bob"), ("purged:3", "carol")]
    with pytest.raises(UnknownWorkflowError, match="purged by carol"):
        Admin(env.engine).describe("again")
