"""Keyed concurrency and rate limits (issue 26 §1, engine/limits/): slots as leases in a limit
document per key, steps that find no room queued there and sent again when a slot frees, the
best waiter first (priority, then fairness between groups, then age)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import Limit
from celery_durable.engine.activities.delivery import request_of
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.model import Attempt
from celery_durable.engine.documents.schema import EXEC_ID, marker_id
from celery_durable.engine.limits.slots import LIMIT_DOC_ID, WAITING
from celery_durable.engine.limits.spec import limit_pk, parse_rate
from celery_durable.engine.limits.table import grant, room
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ConfigurationError
from celery_durable.stores.base import Store
from tests.engine.inprocess import InProcess

T0 = 1_700_000_000.0


def _world(limit: Limit, fan: int, keys: list[str] | None = None, store: Store | None = None) -> InProcess:
    w = InProcess(store=store)
    act = w.registry.add_activity("charge", lambda key, n: f"{key}:{n}", {"limit": limit})

    def fan_out(count: int) -> list[str]:
        ctx = require_context("test")
        futures = [
            ctx.call_activity(act.name, act.codec, ((keys or ["k"])[i % len(keys or ["k"])], i), {}, act.options)
            for i in range(count)
        ]
        return [f.result() for f in futures]

    w.fan_out = w.workflow(fan_out)  # type: ignore[attr-defined]
    return w


def _finish(w: InProcess, attempt: Any) -> None:
    """``attempt`` succeeds (its outcome recorded, its workflow driven)."""
    w.engine.activities.complete(attempt, w.engine.activities.result_doc(attempt, value="x"))


def _queued(w: InProcess) -> list[ActivityRequest]:
    out = [item for kind, item in w.dispatcher.queue if kind == "activity"]
    w.dispatcher.queue.clear()
    return out


def _start(w: InProcess, eid: str, count: int) -> list[ActivityRequest]:
    w.engine.start(w.fan_out, (count,), {}, eid)  # type: ignore[attr-defined]
    return _drives_then_sent(w)


def _drives_then_sent(w: InProcess) -> list[ActivityRequest]:
    """Run the queued drives; the activity messages they sent (taken off the queue)."""
    while any(kind == "drive" for kind, _ in w.dispatcher.queue):
        kind, item = w.dispatcher.queue.popleft()
        if kind == "drive":
            w.engine.drive(item)
        else:
            w.dispatcher.queue.append((kind, item))
    return _queued(w)


def _begin(w: InProcess, req: ActivityRequest) -> tuple[Attempt | None, str]:
    return w.engine.activities.begin(req.execution_id, req.seq, req.run)


def _limit_doc(w: InProcess, name: str, key: str) -> dict[str, Any]:
    doc = w.store.read(limit_pk({"name": name, "key": key}), LIMIT_DOC_ID)
    assert doc is not None
    return doc


def test_at_most_max_running_begin_and_a_freed_slot_goes_to_the_next_waiter() -> None:
    w = _world(Limit("stripe", max_running=2, key=lambda key, n: key), fan=5)
    reqs = _start(w, "e1", 5)
    # the drive's dispatch queued the 3 it had no room for (one write): only 2 messages went out
    assert [r.seq for r in reqs] == [1, 2]
    doc = _limit_doc(w, "stripe", "k")
    assert sorted(doc["holders"]) == ["e1|0|1", "e1|0|2"] and [x["q"] for x in doc["waiters"]] == [3, 4, 5]
    assert doc["due_kind"] == "limit"
    running = [a for a in (_begin(w, r)[0] for r in reqs) if a is not None]
    assert len(running) == 2
    # a delivery of a waiting step (a recovery re-send) is dropped and stays queued once
    docs = w.engine.cache.load("e1")
    late = request_of("e1", docs[marker_id(5, 0)], docs[EXEC_ID])
    attempt, why = _begin(w, late)
    assert attempt is None and why.startswith(WAITING)
    assert len(_limit_doc(w, "stripe", "k")["waiters"]) == 3
    first = running[0]
    w.engine.activities.complete(first, w.engine.activities.result_doc(first, value="x"))
    sent = _queued(w)
    assert [r.seq for r in sent] == [3]  # the oldest waiter, sent again
    nxt, _ = _begin(w, sent[0])
    assert nxt is not None
    doc = _limit_doc(w, "stripe", "k")
    assert len(doc["holders"]) == 2 and len(doc["waiters"]) == 2


def test_without_admission_at_dispatch_a_delivery_queues_itself() -> None:
    """A step whose dispatch could not queue it (the store failed then, or an older worker sent
    it) takes its slot as it begins, or queues itself there."""
    w = _world(Limit("stripe", max_running=1), fan=3)
    w.engine.limits.admit = lambda sends: sends  # type: ignore[method-assign]
    reqs = _start(w, "e1", 3)
    assert len(reqs) == 3
    results = [_begin(w, r) for r in reqs]
    assert [a is not None for a, _ in results] == [True, False, False]
    assert all(why.startswith(WAITING) for a, why in results[1:])
    assert [x["q"] for x in _limit_doc(w, "stripe", "")["waiters"]] == [2, 3]


def test_keys_are_independent() -> None:
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: key), fan=4, keys=["a", "b"])
    reqs = _start(w, "e1", 4)
    began = [a for a in (_begin(w, r)[0] for r in reqs) if a is not None]
    assert sorted(a.seq for a in began) == [1, 2]  # one of a, one of b


def test_priority_then_fairness_then_age() -> None:
    doc: dict[str, Any] = {"max": 1, "holders": {}, "waiters": []}
    doc["waiters"] = [
        {"s": "x|0|1", "p": 5, "g": "A", "at": 1.0, "n": 1},
        {"s": "x|0|2", "p": 1, "g": "A", "at": 3.0, "n": 1},
        {"s": "y|0|1", "p": 1, "g": "B", "at": 2.0, "n": 1},
    ]
    assert [g["s"] for g in grant(doc, 10.0, 30.0)] == ["y|0|1"]  # priority 1 first, then the oldest
    doc["holders"] = {"a|0|9": {"g": "A", "n": 1, "exp": 99.0}}
    doc["max"] = 2
    doc["waiters"] = [
        {"s": "x|0|3", "p": 0, "g": "A", "at": 1.0, "n": 1},
        {"s": "y|0|3", "p": 0, "g": "B", "at": 2.0, "n": 1},
    ]
    # B holds nothing, A holds one: B's step goes first though A's waited longer
    assert [g["s"] for g in grant(doc, 10.0, 30.0)] == ["y|0|3"]


def test_a_rate_holds_over_any_window() -> None:
    doc: dict[str, Any] = {"max": None, "rate": [3, 60.0], "holders": {}, "waiters": [], "starts": [0.0, 30.0, 59.0]}
    assert room(doc, 59.5) == 0
    assert room(doc, 60.5) == 1  # the start at 0 left the window
    assert room(doc, 90.5) == 2


def test_rates_and_limits_are_checked_at_declaration() -> None:
    assert parse_rate("100/m") == (100, 60.0)
    assert parse_rate("5/s") == (5, 1.0)
    for bad in ("100", "x/m", "0/m", "5/w"):
        with pytest.raises(ConfigurationError):
            parse_rate(bad)
    with pytest.raises(ConfigurationError):
        Limit("x")
    with pytest.raises(ConfigurationError):
        Limit("x", max_running=0)
    with pytest.raises(ConfigurationError):
        Limit("bad name", max_running=1)


def test_a_calls_priority_orders_the_queue() -> None:
    """``activity.s(...).set(priority=n)`` (Celery's spelling): the waiting step with the lowest
    number is granted the freed slot first, whatever its age."""
    from types import SimpleNamespace

    w = InProcess()
    w.registry.add_activity("charge", lambda key, n: n, {"limit": Limit("prio", max_running=1)})

    def prioritised() -> list[int]:
        ctx = require_context("test")
        sigs = [
            SimpleNamespace(task="charge", args=("k", i), kwargs={}, options={"priority": p})
            for i, p in enumerate([5, 5, 9, 1])
        ]
        return ctx.gather(sigs)

    wf_def = w.workflow(prioritised)
    w.engine.start(wf_def, (), {}, "p1")
    reqs = _drives_then_sent(w)
    running = [a for a in (_begin(w, r)[0] for r in reqs) if a is not None]
    assert [a.seq for a in running] == [4]  # queued at dispatch: the best priority got the one slot
    order = []
    while running:
        a = running.pop()
        order.append(a.seq)
        w.engine.activities.complete(a, w.engine.activities.result_doc(a, value=a.seq))
        sent = [r for r in _queued(w) if isinstance(r, ActivityRequest)]
        running = [x for x in (_begin(w, r)[0] for r in sent) if x is not None]
    assert order == [4, 1, 2, 3]  # priority 1, then the 5s by age, then 9


def test_a_bad_key_is_a_clear_error() -> None:
    from celery_durable.engine.limits.spec import step_limit

    lim = Limit("k", max_running=1, key=lambda x: x)
    with pytest.raises(ConfigurationError, match="str or int"):
        step_limit(lim, (["a"],), {}, "e", None)
    with pytest.raises(ConfigurationError, match="characters"):
        step_limit(lim, ("",), {}, "e", None)
    with pytest.raises(ConfigurationError, match="priority"):
        step_limit(lim, ("a",), {}, "e", "high")  # type: ignore[arg-type]


def test_an_attempt_whose_lease_lapsed_stops_rather_than_renew_without_its_slot() -> None:
    """Found by the simulation (seeds 19 and 58, no faults): a slot holder's lease lapsed (no
    renewal for a TTL), the recovery scan freed its slot for the next step, then its renewal
    revived the lease nobody had taken and it ran on without a slot, one over max_running."""
    w = _world(Limit("stripe", max_running=1), fan=2)
    (req,) = _start(w, "e1", 2)
    first, _ = _begin(w, req)
    assert first is not None
    w.clock.advance(w.engine.settings.lease_ttl + 1)  # type: ignore[attr-defined]  # a long pause
    w.engine.limits.scan()  # frees the lapsed holder's slot (before the activity scan re-sends its step)
    granted = [r for r in _queued(w) if r.seq == 2]
    assert granted and _begin(w, granted[0])[0] is not None
    assert w.engine.leases.renew(first) is False and first.lost  # stopped, not revived


def test_a_grant_begun_a_period_late_needs_the_rate_again() -> None:
    """Found by the simulation (seed 223): a step granted a rate slot whose message arrived a
    period later began without a rate check, on top of the steps granted once its start had left
    the window."""
    w = _world(Limit("ping", rate="1/m"), fan=2)
    (late,) = _start(w, "e1", 2)  # step 1 granted at t0 (its message will be late); step 2 waits
    w.clock.advance(61)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    (second,) = [r for r in _queued(w) if r.seq == 2]  # the window opened: step 2 granted
    assert _begin(w, second)[0] is not None
    w.clock.advance(9)  # type: ignore[attr-defined]
    attempt, why = _begin(w, late)  # 9 s after step 2 began: the rate allows no start
    assert attempt is None and why.startswith(WAITING)


@pytest.mark.parametrize(
    "options",
    [
        {"limit": "stripe"},  # not a Limit
        {"limit": Limit("l", max_running=1), "local": True},  # a local activity cannot wait
    ],
)
def test_bad_limit_options_are_refused_at_declaration(options: dict[str, Any]) -> None:
    from celery_durable import durable_activity

    with pytest.raises(ConfigurationError):

        @durable_activity(name=f"lim.bad.{len(options)}", **options)
        def bad() -> None: ...


def test_a_limit_given_to_a_stacked_celery_task_is_its_activitys() -> None:
    """``@durable_activity`` over ``@app.task(limit=Limit(...))``: Celery keeps the option as an
    attribute and the activity's definition carries it (``limit=`` on the decorator above a task
    is refused, as heartbeat options are: give it to the task)."""
    from celery import Celery

    from celery_durable import durable_activity
    from celery_durable.engine.registry import GLOBAL_ACTIVITIES

    app = Celery("limits-stacked", broker="memory://", set_as_current=False)
    lim = Limit("stacked", max_running=3)

    @durable_activity
    @app.task(name="lim.stacked", limit=lim, shared=False)  # not shared: no other app gets it
    def stacked(x: int) -> int:
        return x

    def other() -> None: ...

    assert stacked.name == "lim.stacked"  # a task of an app not yet finalized is a proxy: evaluated here
    assert GLOBAL_ACTIVITIES["lim.stacked"].options["limit"] is lim
    with pytest.raises(ConfigurationError, match="give them to the task"):
        durable_activity(limit=lim)(app.task(name="lim.stacked2", shared=False)(other))
