"""Adversarial: the recovery re-send spacing (issue 16) must only space out re-sends of a step
no attempt started since; it must not trust clocks of different machines to tell.

``started_at`` is written by the worker's clock, ``resent_at`` by beat's: a worker a few seconds
behind beat (or a beat whose clock ran ahead once) made a started attempt look like "no attempt
since", so a lapsed or retried attempt whose next message was lost waited 2, 4, 8 timeouts.
"""

from __future__ import annotations

from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.model import marker_id
from tests.engine.inprocess import FakeClock, InProcess


def _queued(env: InProcess) -> str:
    @env.activity
    def work(x: int) -> int:
        return x + 1

    def flow() -> int:
        return int(work(1))

    eid, _ = env.engine.start(env.workflow(flow), (), {})
    env.dispatcher.run_some(1)  # the drive sends the activity; the message waits in the queue
    return eid


def _begin_on_clock(env: InProcess, eid: str, offset: float) -> None:
    """An attempt begins on a worker whose clock is ``offset`` s off beat's."""
    assert isinstance(env.clock, FakeClock)
    env.clock.t += offset
    try:
        attempt, why = env.engine.activities.begin(eid, 1)
        assert attempt is not None, why
        env.engine.leases.untrack(attempt)  # the worker dies: its lease lapses
    finally:
        env.clock.t -= offset


def _spacing(env: InProcess, eid: str) -> float:
    marker = env.store.read(eid, marker_id(1, 0))
    assert marker is not None
    return float(marker["due_at"]) - env.clock.now()


def test_a_lapsed_attempt_on_a_worker_behind_beat_is_re_sent_after_one_timeout() -> None:
    env = InProcess()
    assert isinstance(env.clock, FakeClock)
    eid = _queued(env)
    qt = env.engine.settings.activity_queue_timeout
    for _ in range(3):  # a backlog: three spaced re-sends, none started
        env.clock.advance(8 * qt + 1)
        assert env.engine.recovery.scan().resent == 1
    env.clock.advance(5)
    _begin_on_clock(env, eid, -30.0)  # it starts at last, on a worker 30 s behind beat
    env.clock.advance(env.engine.settings.lease_ttl + 1)
    assert env.engine.recovery.scan().resent == 1  # the lapsed lease: re-sent
    # an attempt did start since the last re-send: if this message is lost, one timeout
    assert _spacing(env, eid) <= qt + 1e-6


def test_a_beat_clock_that_ran_ahead_once_does_not_space_out_started_steps() -> None:
    env = InProcess()
    assert isinstance(env.clock, FakeClock)
    eid = _queued(env)
    qt = env.engine.settings.activity_queue_timeout
    env.clock.advance(qt + 1)
    env.clock.t += 3600.0  # this beat's clock is an hour ahead
    assert env.engine.recovery.scan().resent == 1
    env.clock.t -= 3600.0
    for _ in range(3):  # attempts start (correct clocks) and their workers die, one after another
        env.clock.advance(5)
        _begin_on_clock(env, eid, 0.0)
        env.clock.advance(env.engine.settings.lease_ttl + 1)
        marker = env.store.read(eid, marker_id(1, 0))
        assert marker is not None
        env.clock.t = max(env.clock.t, float(marker["due_at"]) + 1)
        assert env.engine.recovery.scan().resent == 1
        assert _spacing(env, eid) <= qt + 1e-6


def test_a_resumed_step_starts_its_spacing_over() -> None:
    """A step re-sent 4 times in a backlog, the execution cancelled, then resumed (the step is
    sent afresh). That message is lost: recovery's re-sends come 1, 2, 4 timeouts apart again,
    not 8 from the count of the cancelled run's backlog."""
    env = InProcess()
    assert isinstance(env.clock, FakeClock)
    eid = _queued(env)
    qt = env.engine.settings.activity_queue_timeout
    for _ in range(4):
        env.clock.advance(8 * qt + 1)
        assert env.engine.recovery.scan().resent == 1
    env.dispatcher.queue.clear()  # the backlog is still on its way
    env.engine.cancel(eid)
    env.worker.run()
    assert env.status(eid) == "cancelled"
    Admin(env.engine).resume(eid)
    assert env.status(eid) == "running"
    env.dispatcher.queue.clear()  # the resumed step's message is lost
    env.clock.advance(qt + 1)
    assert env.engine.recovery.scan().resent == 1
    assert _spacing(env, eid) <= qt + 1e-6  # the first re-send of this loss
