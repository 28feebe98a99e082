"""An eager activity's first lease, taken by the commit that schedules it (issue 28):
``claim_kept`` in the commit, ``begin(claimed=...)`` without a write, ``unclaim`` when it is sent
after all; a process killed between the commit and the attempt is recovered once the lease
lapses, not after the activity queue timeout."""

from __future__ import annotations

from typing import Any

from celery_durable.engine import InlineDispatcher
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.model import marker_id
from tests.engine.inprocess import InProcess


def _env(eager: bool) -> tuple[InProcess, Any]:
    env = InProcess()
    env.dispatcher = InlineDispatcher(eager=eager)
    env.engine.dispatcher = env.dispatcher
    from celery_durable.engine.drive.in_process import LocalWorker

    env.worker = LocalWorker(env.engine, env.dispatcher)

    @env.activity
    def inc(x: int) -> int:
        return x + 1

    def three() -> int:
        return int(inc(inc(inc(0))))

    return env, env.workflow(three)


def _first_send(env: InProcess) -> ActivityRequest:
    """Start the workflow and run its first drive only; the activity it sent."""
    kind, item = env.dispatcher.queue.popleft()
    assert kind == "drive"
    env.engine.drive(str(item))
    kind, req = env.dispatcher.queue[0]
    assert kind == "activity" and isinstance(req, ActivityRequest)
    return req


def test_the_commit_takes_the_kept_activitys_lease_and_its_attempt_writes_nothing() -> None:
    env, wf = _env(eager=True)
    eid, _ = env.engine.start(wf, (), {})
    req = _first_send(env)
    assert req.holder is not None
    marker = env.store.read(eid, marker_id(req.seq, req.run))
    assert marker is not None
    now, ttl = env.clock.now(), env.engine.settings.lease_ttl
    assert marker["lease"] == {"holder": req.holder, "expires": now + ttl}
    assert marker["attempts"] == 1 and marker["due_at"] == now + ttl and marker["due_kind"] == "activity"
    # a message for the step (a duplicate, a forged one) cannot run it while that lease lives
    attempt, why = env.engine.activities.begin(eid, req.seq, req.run)
    assert attempt is None and "another attempt" in why
    # nor can a wrong holder claim it
    attempt, why = env.engine.activities.begin(eid, req.seq, req.run, claimed="someone:else")
    assert attempt is None
    attempt, why = env.engine.activities.begin(eid, req.seq, req.run, claimed=req.holder)
    assert attempt is not None and attempt.holder == req.holder and attempt.number == 1
    after = env.store.read(eid, marker_id(req.seq, req.run))
    assert after is not None and after["_etag"] == marker["_etag"]  # no write
    env.engine.leases.untrack(attempt)


def test_a_workflow_runs_to_its_end_with_claimed_leases() -> None:
    env, wf = _env(eager=True)
    eid, _ = env.engine.start(wf, (), {})
    env.run()
    assert env.status(eid) == "completed" and env.ex(eid)["result"] == 3
    results = [d for d in env.store.query_partition(eid).docs if d.get("type") == "result"]
    assert [r["attempts"] for r in results] == [1, 1, 1]


def test_a_worker_killed_before_the_kept_attempt_is_recovered_when_the_lease_lapses() -> None:
    env, wf = _env(eager=True)
    eid, _ = env.engine.start(wf, (), {})
    req = _first_send(env)
    env.dispatcher.queue.clear()  # the process died: the kept activity is gone with it
    settings = env.engine.settings
    assert settings.activity_queue_timeout > settings.lease_ttl
    env.clock.advance(settings.lease_ttl - 1)
    assert env.engine.recovery.scan().resent == 0  # the lease still lives
    env.clock.advance(2)  # lapsed: long before the queue timeout
    assert env.engine.recovery.scan().resent == 1
    env.run()
    assert env.status(eid) == "completed"
    marker = env.store.read(eid, marker_id(req.seq, req.run))
    assert marker is not None and marker["lost"] == 1


def test_unclaim_gives_the_lease_back_for_the_message_sent_instead() -> None:
    env, wf = _env(eager=True)
    eid, _ = env.engine.start(wf, (), {})
    req = _first_send(env)
    env.engine.activities.unclaim(req)
    marker = env.store.read(eid, marker_id(req.seq, req.run))
    assert marker is not None and marker["lease"] is None and marker["attempts"] == 0
    assert "started_at" not in marker
    assert marker["due_at"] == env.clock.now() + env.engine.settings.activity_queue_timeout
    attempt, _ = env.engine.activities.begin(eid, req.seq, req.run)  # the message's delivery
    assert attempt is not None and attempt.number == 1
    env.engine.leases.untrack(attempt)


def test_unclaim_leaves_a_lease_that_is_no_longer_the_claims() -> None:
    env, wf = _env(eager=True)
    eid, _ = env.engine.start(wf, (), {})
    req = _first_send(env)
    env.clock.advance(env.engine.settings.lease_ttl + 1)
    env.engine.recovery.scan()  # lapsed and re-sent
    taken, _ = env.engine.activities.begin(eid, req.seq, req.run)
    assert taken is not None
    env.engine.activities.unclaim(req)  # late: the re-sent attempt's lease stays
    marker = env.store.read(eid, marker_id(req.seq, req.run))
    assert marker is not None and marker["lease"]["holder"] == taken.holder
    env.engine.leases.untrack(taken)


def test_without_eager_the_commit_takes_no_lease() -> None:
    env, wf = _env(eager=False)
    eid, _ = env.engine.start(wf, (), {})
    req = _first_send(env)
    assert req.holder is None
    marker = env.store.read(eid, marker_id(req.seq, req.run))
    assert marker is not None and marker.get("lease") is None and marker["attempts"] == 0
