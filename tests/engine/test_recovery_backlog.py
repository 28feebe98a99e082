"""A broker backlog must not be multiplied by the recovery scan (issue 16, the chaos MISS).

An activity whose message waits in a queue longer than ``activity_queue_timeout`` is re-sent by
the recovery scan, since its message may have been lost. When it was merely queued behind a
backlog, every re-send is one more message in that backlog; re-sending it again every timeout
grew the queue without bound (chaos run on Cosmos: 2,782 re-sends for 400 steps, 2,286
deliveries that found their step done, 65/80 workflows in 400 s). Consecutive re-sends of a step
no attempt has started since are spaced out (doubling, at most 8 timeouts apart); a step whose
attempt was started is re-sent after one timeout as before.
"""

from __future__ import annotations

from celery_durable.engine.documents.model import marker_id
from tests.engine.inprocess import FakeClock, InProcess


def _queued_activity(env: InProcess) -> str:
    """An execution whose first activity message was sent but not delivered (a long queue)."""

    @env.activity
    def work(x: int) -> int:
        return x + 1

    def flow() -> int:
        return int(work(1))

    definition = env.workflow(flow)
    eid, _ = env.engine.start(definition, (), {})
    env.dispatcher.run_some(1)  # the drive, which sends the activity
    assert [kind for kind, _ in env.dispatcher.queue] == ["activity"]
    return eid


def test_a_queued_activity_is_re_sent_with_growing_intervals() -> None:
    env = InProcess()
    assert isinstance(env.clock, FakeClock)
    eid = _queued_activity(env)
    timeout = env.engine.settings.activity_queue_timeout
    resends = 0
    for _ in range(40):  # 40 timeouts of a backlog, scanned four times per timeout
        for _ in range(4):
            env.clock.advance(timeout / 4)
            resends += env.engine.recovery.scan().resent
    # every timeout would be 40; doubling (1, 2, 4, 8, 8, ...) gives 1 + 1 + 1 + 1 + 4 = 8
    assert 3 <= resends <= 9, resends
    assert len(env.dispatcher.queue) == 1 + resends
    env.worker.run()  # the backlog drains: the step runs once, the copies find it done
    assert env.status(eid) == "completed"


def test_the_first_re_send_and_a_lapsed_attempt_are_prompt() -> None:
    env = InProcess()
    assert isinstance(env.clock, FakeClock)
    eid = _queued_activity(env)
    timeout = env.engine.settings.activity_queue_timeout
    env.clock.advance(timeout + 1)
    assert env.engine.recovery.scan().resent == 1  # the message may have been lost: re-sent
    env.clock.advance(2 * timeout + 1)
    assert env.engine.recovery.scan().resent == 1  # still queued: re-sent again, later
    # an attempt starts, then its worker dies: the lapsed lease is re-sent one lease later and the
    # next queue wait is back to one timeout
    attempt, why = env.engine.activities.begin(eid, 1)
    assert attempt is not None, why
    env.clock.advance(env.engine.settings.lease_ttl + 1)
    assert env.engine.recovery.scan().resent == 1
    marker = env.store.read(eid, marker_id(1, 0))
    assert marker is not None and marker["due_at"] <= env.clock.now() + timeout + 1e-6
