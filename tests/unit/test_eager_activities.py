"""When a delivery keeps the next activity to run it eagerly, and when it must send it
(celery_durable/glue/eager_activities.py): each rule here is one way an eager run would not behave as
the delivery Celery would make of the message."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.glue.eager_activities import Drain, committing, draining, keep, keeps


class Sender:
    def __init__(self) -> None:
        self.published: list[str] = []

    def publish_activity(self, request: ActivityRequest) -> None:
        self.published.append(request.task_id)

    def activity_options(self, request: ActivityRequest) -> dict[str, Any]:
        return {"task_id": request.task_id, "headers": {}}


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("eager-unit", set_as_current=False)
    app.conf.task_default_queue = "work"

    @app.task(name="t.step", shared=False)
    def step(x: int) -> int:
        return x

    @app.task(name="t.limited", shared=False, time_limit=30)
    def limited(x: int) -> int:
        return x

    @app.task(name="t.rate_limited", shared=False, rate_limit="10/m")
    def rate_limited(x: int) -> int:
        return x

    @app.task(name="t.own_queue", shared=False, queue="gpu")
    def own_queue(x: int) -> int:
        return x

    app.conf.task_routes = {"t.routed": {"queue": "slow"}, "t.prioritised": {"priority": 5}}

    @app.task(name="t.prioritised", shared=False)
    def prioritised(x: int) -> int:
        return x

    @app.task(name="t.routed", shared=False)
    def routed(x: int) -> int:
        return x

    yield app


def delivery(app: Celery, **request: Any) -> Any:
    """A task object as an activity's delivery sees itself."""
    fields = {"delivery_info": {"exchange": "", "routing_key": "work"}, "is_eager": False, "called_directly": False}
    limits = {"time_limit": None, "soft_time_limit": None}
    return SimpleNamespace(app=app, request=SimpleNamespace(**(fields | request)), **limits)


def req(name: str = "t.step", seq: int = 2, execution_id: str = "e1", holder: str | None = "w:1") -> ActivityRequest:
    """An activity a commit sends; ``holder``: the lease that commit took for it (``keeps`` said yes)."""
    return ActivityRequest(execution_id, seq, name, [1], {}, f"{execution_id}:{seq}", "wf", holder=holder)


def kept(request: ActivityRequest) -> bool:
    """``keep`` asked from the commit of a drive of execution e1."""
    with committing("e1"):
        return keep(request)


def test_a_delivery_keeps_the_first_activity_routed_to_its_queue(app: Celery) -> None:
    sender = Sender()
    with draining(delivery(app), 5, sender) as drain:
        assert isinstance(drain, Drain)
        assert kept(req(seq=2)) is True
        assert kept(req(seq=3)) is False  # one at a time: the rest of a fan-out is sent
        assert drain.pending is not None and drain.pending.request.seq == 2
    assert sender.published == ["e1:2"]  # kept and not run: sent on the way out


def test_a_kept_activity_is_sent_when_the_delivery_raises(app: Celery) -> None:
    sender = Sender()
    with pytest.raises(RuntimeError), draining(delivery(app), 5, sender):
        assert kept(req())
        raise RuntimeError("the commit's caller failed after the commit")
    assert sender.published == ["e1:2"]


@pytest.mark.parametrize(
    "name",
    ["t.limited", "t.rate_limited", "t.own_queue", "t.routed", "t.unknown"],
    ids=["task-time-limit", "task-rate-limit", "task-queue-option", "task-routes", "not-registered-here"],
)
def test_an_activity_a_delivery_could_not_run_as_celery_would_is_sent(app: Celery, name: str) -> None:
    sender = Sender()
    with draining(delivery(app), 5, sender) as drain:
        assert drain is not None
        assert kept(req(name)) is False
    assert sender.published == []  # not kept: the dispatcher sends it itself


@pytest.mark.parametrize(
    "case",
    ["off", "no-sender", "applied", "called-directly", "no-queue", "message-time-limit", "worker-time-limit"],
)
def test_no_eager_run_from_a_delivery_that_is_not_a_plain_broker_delivery(app: Celery, case: str) -> None:
    budget, sender, request = 5, Sender(), {}
    if case == "off":
        budget = 0
    elif case == "applied":
        request = {"is_eager": True}
    elif case == "called-directly":
        request = {"called_directly": True}
    elif case == "no-queue":
        request = {"delivery_info": {}}
    elif case == "message-time-limit":
        request = {"timelimit": (None, 60)}
    elif case == "worker-time-limit":
        app.conf.task_soft_time_limit = 60
    with draining(delivery(app, **request), budget, None if case == "no-sender" else sender) as drain:
        assert drain is None
        assert kept(req()) is False


def test_an_eager_run_keeps_for_the_outer_delivery(app: Celery) -> None:
    """An eager activity's own commit does not open a drain of its own: the outer delivery's
    runs the next one (one loop, a budget for the whole run, no recursion)."""
    sender = Sender()
    with draining(delivery(app), 1, sender) as outer:
        with draining(delivery(app), 1, sender) as inner:
            assert inner is None
            assert kept(req())
        assert outer is not None and outer.pending is not None


def test_only_the_commits_own_sends_are_kept(app: Celery) -> None:
    """What the delivery's own code sends outside its commit (an activity's body starting a
    workflow with eager start), or a commit sends for another execution (a local activity's
    body doing so), goes out: kept, it would wait for the code that waits for it."""
    sender = Sender()
    with draining(delivery(app), 5, sender) as drain:
        assert keep(req()) is False  # no commit running
        assert kept(req(execution_id="e2")) is False  # the commit of e1 sends for e2
        assert drain is not None and drain.pending is None
        assert kept(req()) is True


def test_no_activity_is_kept_while_the_worker_stops(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.worker import state

    sender = Sender()
    monkeypatch.setattr(state, "should_stop", 0)
    with draining(delivery(app), 5, sender):
        assert kept(req()) is False


def test_the_workers_own_time_limit_counts(app: Celery) -> None:
    """``celery worker --time-limit``/``--soft-time-limit`` are not in app.conf: the bootstep
    notes them, and then no delivery keeps an activity."""
    from celery_durable.glue.pools import note_worker_limits

    sender = Sender()
    note_worker_limits(None, 30.0)
    try:
        with draining(delivery(app), 5, sender) as drain:
            assert drain is None
    finally:
        note_worker_limits(None, None)
    with draining(delivery(app), 5, sender) as drain:
        assert drain is not None


def test_a_route_without_a_queue_means_the_default_queue_and_sets_the_priority(app: Celery) -> None:
    """``task_routes = {name: {"priority": 5}}``: Celery sends it to the default queue (the
    delivery's here) at priority 5; the kept run's request says so too."""
    sender = Sender()
    with draining(delivery(app), 5, sender) as drain:
        assert kept(req("t.prioritised")) is True
        assert drain is not None and drain.pending is not None and drain.pending.priority == 5


def test_only_an_activity_whose_commit_took_its_lease_is_kept(app: Celery) -> None:
    """``keeps`` (before the commit) and ``keep`` (after it) agree, and an activity sent with no
    claimed lease (the commit did not ask, or asked another) is sent: a process killed before
    it starts must leave a lease that lapses, not a step that waits for the queue timeout."""
    with draining(delivery(app), 5, Sender()) as drain:
        assert drain is not None
        with committing("e1"):
            assert keeps(req(holder=None))
            assert keep(req(holder=None)) is False
            assert drain.pending is None
            assert keep(req()) is True
            assert keeps(req(seq=3)) is False  # one at a time
