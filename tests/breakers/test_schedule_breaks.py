"""Attacks on managed schedules (``durable.schedules``: celery_durable/schedules.py,
engine/schedules/, the clock pass, ``WorkflowEnvironment.schedules``).

The promises (docs/guides/schedules.md, engine/schedules/ docstrings, the README): each tick
starts one execution ``<name>@<tick>``; ``trigger`` starts one execution now by the overlap
policy (a kept one starts when the running one ends); jitter delays a tick by a fixed amount
and a tick is counted ``missed`` only when beat was down longer than the catch-up window; bad
input is refused in the caller with a clear error and stores nothing; a value is never changed
(or left unchanged) silently; nothing is lost.

Tests under "breaks" failed on the code they were written against (4a81e22); those under "held"
document attacks that did not break it. They run on ``WorkflowEnvironment`` (a fake clock).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, Limit
from celery_durable import workflow as wf
from celery_durable.engine.core import Engine
from celery_durable.engine.dispatcher import InlineDispatcher
from celery_durable.engine.documents.model import EXEC_ID, Settings
from celery_durable.engine.schedules import manage
from celery_durable.engine.schedules.firing import SCHEDULES_PK, fire_due, schedule_id, tick_execution_id
from celery_durable.errors import ConfigurationError, StoreError
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import FakeClock, WorkflowEnvironment

pytestmark = pytest.mark.adversarial

app = Celery("schedule-breaks", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = 3600.0


@durable.workflow(name="sb.job")
def job(seconds: float = 0.0) -> str:
    if seconds:
        wf.sleep(seconds)
    return wf.execution_id()


limited_app = Durable(Celery("schedule-breaks-limits", set_as_current=False, broker="memory://"), store="memory://")


@limited_app.workflow(name="sb.limited", limit=Limit("sb-one", max_running=1))
def limited(seconds: float = 0.0) -> str:
    wf.sleep(seconds)
    return wf.execution_id()


@limited_app.workflow(name="sb.keyed", limit=Limit("sb-keyed", max_running=1, key=lambda customer: customer.upper()))
def keyed(customer: str | None) -> str:
    return str(customer)


code_app = Durable(Celery("schedule-breaks-code", set_as_current=False, broker="memory://"), store="memory://")


@code_app.workflow(name="sb.limited", limit=Limit("sb-one", max_running=1))
def limited_in_code(seconds: float = 0.0) -> str:
    wf.sleep(seconds)
    return wf.execution_id()


code_app.schedule("lim", limited_in_code, timedelta(hours=1), 9000.0)


def _env() -> WorkflowEnvironment:
    return WorkflowEnvironment(durable, start=T0)


def _runs(env: WorkflowEnvironment, name: str) -> dict[str, str]:
    found = env.list_executions(limit=500).executions
    return {e.id: str(e.status) for e in found if e.id.startswith(name + "@")}


def _sorted(env: WorkflowEnvironment, ids: list[str]) -> list[Any]:
    found = {e.id: e for e in env.list_executions(limit=500).executions}
    return [found[i] for i in ids]


def _doc(env: WorkflowEnvironment, name: str) -> dict[str, Any]:
    doc = env.store.read(SCHEDULES_PK, schedule_id(name))
    assert doc is not None
    return doc


def _stamp(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y%m%dT%H%M%S")


# --- breaks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["buffer_one", "cancel_other"])
def test_a_kept_trigger_in_the_second_of_a_running_tick_starts_its_own_execution(overlap: str) -> None:
    """Broken: a trigger kept by ``buffer_one``/``cancel_other`` was stored as a bare time and
    started, once the running one ended, under ``tick_execution_id`` of that time (to the
    second). Triggered in the second of the running tick, that is the running tick's own id:
    create-only, nothing started, though counted ``started`` (buffer_one); under
    ``cancel_other`` the trigger cancelled the running tick and then ran nothing at all."""
    env = _env()
    env.schedules.create("k", job, 600.0, every=timedelta(hours=1), overlap=overlap)
    env.advance(timedelta(hours=1, seconds=0.3))
    tick = f"k@{(T0 + timedelta(hours=1)).strftime('%Y%m%dT%H%M%S')}"
    assert _runs(env, "k") == {tick: "running"}
    assert env.schedules.trigger("k") is None  # kept: the tick still runs
    env.advance(timedelta(minutes=30))
    runs = _runs(env, "k")
    assert len(runs) == 2, runs  # the tick and the kept trigger, each its own execution
    assert runs[tick] == ("completed" if overlap == "buffer_one" else "cancelled")
    (kept,) = set(runs) - {tick}
    assert kept.startswith("k@20260101T010000.") and runs[kept] == "completed"
    assert env.schedules.get("k").counts == {"started": 2}  # type: ignore[union-attr]


def test_two_triggers_at_one_instant_start_two_executions() -> None:
    """Broken: a trigger's id is its time to the microsecond; two triggers at one instant (a
    coarse clock, the fake clock of WorkflowEnvironment) got one id, so under ``allow_all`` the
    second returned the first's id as started and counted ``started`` twice for one execution."""
    env = _env()
    env.schedules.create("tt", job, 600.0, every=timedelta(hours=1), overlap="allow_all")
    first, second = env.schedules.trigger("tt"), env.schedules.trigger("tt")
    assert first is not None and second is not None and first != second
    env.run_until_idle()
    assert set(_runs(env, "tt")) == {first, second}
    assert env.schedules.get("tt").counts == {"started": 2}  # type: ignore[union-attr]


def test_jitter_longer_than_the_interval_misses_no_tick_while_beat_is_up() -> None:
    """Broken: a jitter longer than the time between two ticks made a tick wait behind the
    previous tick's longer delay; the ticks then fired in bursts, counted ``missed`` (late past
    the catch-up window though beat never stopped) and ``skipped`` (the burst's first still
    running). The delay is now at most the time to the next tick (as Temporal caps it)."""
    env = _env()
    env.schedules.create("jj", job, every=60, jitter=timedelta(minutes=10))
    env.advance(timedelta(hours=1))
    runs = _runs(env, "jj")
    ticks = [f"jj@{(T0 + timedelta(minutes=m)).strftime('%Y%m%dT%H%M%S')}" for m in range(1, 60)]
    assert set(ticks) <= set(runs)  # 01:00's own delay may end after the hour
    assert env.schedules.get("jj").counts == {"started": len(runs)}  # type: ignore[union-attr]
    delays = [e.created_at - T0.timestamp() - 60 * m for m, e in enumerate(_sorted(env, ticks), 1)]
    assert all(0 <= d < 60 for d in delays) and len(set(delays)) > 50  # jittered, each below the interval


def test_an_interval_under_a_second_is_refused() -> None:
    """Broken: ``every=0.5`` was stored; its ticks' ids are to the second, so two ticks shared one
    id: half of them started nothing but were counted ``started`` (20 counted, 11 executions)."""
    env = _env()
    with pytest.raises(ConfigurationError, match="at least 1 second"):
        env.schedules.create("half", job, every=0.5, overlap="allow_all")
    env.schedules.create("ok", job, every=60)
    with pytest.raises(ConfigurationError, match="at least 1 second"):
        env.schedules.update("ok", every=0.25)
    assert env.schedules.get("half") is None and env.schedules.get("ok").spec == "every 0:01:00"  # type: ignore[union-attr]


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 feb-apr/2 *"])
def test_a_cron_expression_that_never_matches_a_date_is_refused(expr: str) -> None:
    """Broken: a cron expression naming a day no month has (30 February) parsed, and a schedule
    that can never fire was stored silently (next fire ``None``)."""
    env = _env()
    with pytest.raises(ConfigurationError, match="never"):
        env.schedules.create("never", job, cron=expr)
    assert env.schedules.get("never") is None


def test_update_refuses_a_raw_payload_instead_of_ignoring_it() -> None:
    """Broken: ``payload`` is in the fields update() accepts, but the facade dropped it: the call
    succeeded and the stored input stayed as it was (a change lost silently)."""
    env = _env()
    env.schedules.create("pl", job, every=60)
    with pytest.raises(ConfigurationError, match="payload"):
        env.schedules.update("pl", payload={"args": [5.0], "kwargs": {}})
    assert _doc(env, "pl")["payload"] == {"args": [], "kwargs": {}}
    env.schedules.update("pl", args=(5.0,))  # the way to change it
    assert _doc(env, "pl")["payload"] == {"args": [5.0], "kwargs": {}}


@pytest.mark.parametrize("kind", ["managed", "code"])
def test_a_scheduled_start_waits_on_its_workflows_limit(kind: str) -> None:
    """Broken: a tick created its execution without the workflow's declared ``limit=`` (start()
    computes it, the firing called create_execution bare): with ``max_running=1`` three ticks ran
    at once. Managed schedules (the firing) and those declared in code (beat's start task, and
    WorkflowEnvironment's ticks) alike: each now waits ``queued`` for a slot."""
    env = WorkflowEnvironment(limited_app if kind == "managed" else code_app, start=T0)
    if kind == "managed":
        env.schedules.create("lim", limited, 9000.0, every=timedelta(hours=1), overlap="allow_all")
    env.advance(timedelta(hours=3))
    statuses = sorted(_runs(env, "lim").values())
    assert statuses == ["queued", "queued", "running"], statuses


def test_a_limit_key_that_fails_on_the_schedules_input_is_refused_at_create() -> None:
    """Broken with the above: the key function of a workflow's limit would run only at a tick; an
    input it cannot key raises at create, in the caller (its own error, as start() gives it), and
    stores nothing."""
    env = WorkflowEnvironment(limited_app, start=T0)
    with pytest.raises(AttributeError, match="upper"):
        env.schedules.create("badkey", keyed, None, every=timedelta(hours=1))
    assert env.schedules.get("badkey") is None


def test_the_cli_refuses_a_backfill_time_it_cannot_read_with_a_clear_error() -> None:
    """Broken: ``durable schedule backfill NAME yesterday …`` died on ``datetime.fromisoformat``'s
    ValueError (a traceback) instead of a usage error naming the value."""
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    from celery_durable.stores.memory import MemoryStore
    from tests.apps import basic

    basic.durable.configure(store=MemoryStore())
    try:
        basic.durable.schedules.create("cli-bf", basic.ticker, "x", every=timedelta(hours=1))
        args = ["schedule", "backfill", "cli-bf", "yesterday", "2026-01-02T00:00:00+00:00"]
        out = CliRunner().invoke(celery_cli, ["-A", "tests.apps.basic", "durable", *args])
        assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.exception
        assert "'yesterday' is not an ISO time" in out.output
        assert [a["action"] for a in basic.durable.schedules.get("cli-bf").actions] == ["create"]  # type: ignore[union-attr]
    finally:
        basic.durable.configure(store=None)


def test_cancel_other_asks_again_when_the_firer_died_before_its_cancel() -> None:
    """Broken: ``cancel_other`` wrote its decision (the tick kept) and then asked the cancel; a
    firer killed between the two (or a cancel that failed) left the running one uncancelled, and
    the kept tick waited for it to end on its own (here 5 hours) or for the next tick. Every
    firing that finds a tick kept by ``cancel_other`` now asks the cancel of a running one not
    yet asked."""
    env = _env()
    env.schedules.create("co", job, 5 * HOUR, every=timedelta(hours=1), overlap="cancel_other")
    env.advance(timedelta(hours=1, seconds=1))
    real = env.engine.cancel

    def killed(*args: Any, **kwargs: Any) -> bool:
        raise KeyboardInterrupt("the firer dies before its cancel")

    env.engine.cancel = killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        env.advance(timedelta(hours=1))
    env.engine.cancel = real  # type: ignore[method-assign]
    env.advance(5)  # the next clock scans
    assert _runs(env, "co") == {f"co@{_stamp(60)}": "cancelled", f"co@{_stamp(120)}": "running"}


def test_cancel_other_with_two_ticks_due_at_once_cancels_the_first_it_started() -> None:
    """Broken: beat down for two ticks of a ``cancel_other`` schedule: one firing decided to start
    the first and, for the second, to cancel the first — before it was created (the cancel failed,
    logged); the first then ran uncancelled and the second waited for it (here 5 hours)."""
    env = _env()
    env.schedules.create("c2", job, 5 * HOUR, every=timedelta(minutes=1), overlap="cancel_other")
    env.clock.advance(121)  # 00:01 and 00:02 due
    env.advance(5)
    assert _runs(env, "c2") == {f"c2@{_stamp(1)}": "cancelled", f"c2@{_stamp(2)}": "running"}


def test_the_environment_does_not_step_second_by_second_while_a_kept_tick_waits() -> None:
    """Broken: while a tick is kept (``buffer_one``) and the running one goes on, the schedule is
    due every clock interval (it polls for the end); ``WorkflowEnvironment.advance`` stepped the
    fake clock through each of those seconds with a full scan: 12,600 firings for 3.5 hours
    (a month: minutes of wall time). It now jumps to the next moment an execution can end (a
    timer, a retry, a rate opening) or the next tick; the kept tick still starts at the end."""
    env = _env()
    env.schedules.create("bk", job, 2.5 * HOUR, every=timedelta(hours=1), overlap="buffer_one")
    writes = 0
    real = env.store.replace

    def counted(doc: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal writes
        writes += doc.get("pk") == SCHEDULES_PK
        return real(doc, *args, **kwargs)

    env.store.replace = counted  # type: ignore[method-assign]
    env.advance(timedelta(hours=6))
    found = {e.id: e for e in env.list_executions(limit=50).executions if e.id.startswith("bk@")}
    # 01:00 runs to 03:30; 03:00 (kept, 02:00 dropped) starts at its end (within a clock
    # interval) and runs to 06:00, when 05:00 (kept, 04:00 dropped) starts
    assert sorted(found) == [f"bk@{_stamp(60)}", f"bk@{_stamp(180)}", f"bk@{_stamp(300)}"]
    for kept, end in ((180, 3.5), (300, 6.0)):
        assert 0 <= found[f"bk@{_stamp(kept)}"].created_at - (T0.timestamp() + end * HOUR) <= 1.0
    assert writes < 50, writes


def test_who_and_why_of_a_schedule_action_are_checked_not_stored_as_given() -> None:
    """Broken: ``by`` and ``reason`` were stored as given: a 5 MB reason (kept in the schedule's
    latest actions, rewritten by every firing; past Cosmos' document size), a number as ``by``, a
    list as a reason. They are checked as an execution's operator actions check them."""
    env = _env()
    env.schedules.create("wh", job, every=60)
    with pytest.raises(ConfigurationError, match="at most 4096"):
        env.schedules.pause("wh", reason="x" * 5_000_000)
    with pytest.raises(ConfigurationError, match="by must be"):
        env.schedules.pause("wh", by=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="reason must be"):
        env.schedules.pause("wh", reason=["why"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="by must be"):
        env.schedules.trigger("wh", by="  ")
    info = env.schedules.get("wh")
    assert info is not None and not info.paused and [a["action"] for a in info.actions] == ["create"]
    assert _runs(env, "wh") == {}
    with pytest.raises(ConfigurationError, match="by is 300"):
        env.schedules.create("wh2", job, every=60, by="o" * 300)
    assert env.schedules.get("wh2") is None


def test_a_backfilled_tick_that_ran_already_is_neither_counted_nor_blocking() -> None:
    """Broken: a backfilled tick whose execution exists (it ran) was decided as a start: counted
    ``started`` again (8 for 4 executions), made ``last``, and taken as running, so by ``skip``
    the range's ticks that never ran were skipped behind it and never run. It is now left out
    of the decision (still returned: its id exists)."""
    env = _env()
    env.clock.advance(6 * HOUR)
    env.schedules.create("bd", job, 600.0, every=timedelta(hours=1))
    ran = env.schedules.backfill("bd", T0, T0 + timedelta(hours=1))
    env.run_until_idle()  # bd@00:00 ran (600 s of fake time pass only with the clock)
    env.advance(700)
    assert _runs(env, "bd") == {f"bd@{_stamp(0)}": "completed"}
    again = env.schedules.backfill("bd", T0, T0 + timedelta(hours=3))  # by skip
    assert again == [*ran, f"bd@{_stamp(60)}"]  # 00:00 ran already; 01:00 starts; 02:00 finds it running
    env.run_until_idle()
    assert _runs(env, "bd") == {f"bd@{_stamp(0)}": "completed", f"bd@{_stamp(60)}": "running"}
    assert env.schedules.get("bd").counts == {"started": 2, "skipped": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize("at", [-1e15, 1e15, datetime(9999, 12, 31, 23, 59, tzinfo=UTC).timestamp()])
def test_a_time_no_date_can_hold_is_refused_before_anything_is_stored(at: float) -> None:
    """Broken: ``backfill`` over a range outside the years datetime holds raised a raw ValueError
    (``year 31690708 is out of range``) after recording a ``backfill`` action; ``create`` with
    such a ``start_at`` stored a schedule that never fires (``every``) or raised the raw
    ValueError (``cron``). They are refused in the caller, as ConfigurationError, storing nothing."""
    env = _env()
    env.schedules.create("far", job, every=60)
    with pytest.raises(ConfigurationError, match="between the years"):
        env.schedules.backfill("far", at, at + 120)
    assert [a["action"] for a in env.schedules.get("far").actions] == ["create"]  # type: ignore[union-attr]
    for timing in ({"every": 60}, {"cron": "0 0 * * *"}):
        with pytest.raises(ConfigurationError, match="between the years"):
            env.schedules.create("later", job, start_at=at, **timing)  # type: ignore[arg-type]
        assert env.schedules.get("later") is None


@pytest.mark.parametrize("every", [300, 300.0, "schedule"], ids=["int", "float", "celery-schedule"])
def test_a_schedule_declared_in_code_every_n_seconds_is_listed_and_ticks(every: Any) -> None:
    """Broken: ``Durable.schedule(name, wf, 300)`` (beat's seconds) or a Celery ``schedule(...)``
    was accepted, but ``durable.schedules.list()`` then raised for every schedule (``cron must
    be a string…``): the CLI's ``schedule list`` and the UI's Schedules page were down for all
    of them; WorkflowEnvironment.advance raised AttributeError on the number. Both are read as
    the interval they mean (a timedelta); anything else (a solar schedule) is refused there."""
    from celery.schedules import schedule as celery_schedule

    d = Durable(Celery(f"schedule-breaks-every-{type(every).__name__}", set_as_current=False), store="memory://")
    w = d.workflow(name="sb.every")(lambda: "ok")
    d.schedule("n", w, celery_schedule(timedelta(seconds=300)) if every == "schedule" else every)
    env = WorkflowEnvironment(d, start=T0)
    (info,) = env.schedules.list()
    assert info.kind == "code" and info.spec == "every 0:05:00"
    env.advance(timedelta(minutes=10))
    assert sorted(_runs(env, "n")) == [f"n@{_stamp(5)}", f"n@{_stamp(10)}"]
    with pytest.raises(ConfigurationError, match="timedelta or a Celery crontab"):
        d.schedule("bad", w, object())


def test_a_managed_schedule_shadowed_by_a_later_declaration_in_code_can_still_be_deleted() -> None:
    """create() refuses a name declared in code, but a declaration added later (a deploy) of a
    managed schedule's name left the managed one unreachable: delete, pause and update raised
    "declared in code". Now the managed one is what actions and get() reach while it exists (the
    listing shows both and logs a warning: they tick into the same ids, one execution a tick)."""
    d = Durable(Celery("schedule-breaks-shadow", set_as_current=False), store="memory://")
    w = d.workflow(name="sb.shadow")(lambda: "ok")
    env = WorkflowEnvironment(d, start=T0)
    env.schedules.create("same", w, every=timedelta(hours=1))
    d.schedule("same", w, timedelta(hours=6))  # the deploy after
    assert env.schedules.get("same").kind == "managed"  # type: ignore[union-attr]
    assert env.schedules.pause("same") is True
    assert sorted(i.kind for i in env.schedules.list() if i.name == "same") == ["code", "managed"]
    assert env.schedules.delete("same") is True
    assert env.schedules.get("same").kind == "code"  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="declared in code"):
        env.schedules.delete("same")


def test_a_limit_key_failing_at_a_tick_pauses_the_schedule_with_the_error() -> None:
    """Broken with the limit fix: a workflow's limit key that fails on the stored input (the key
    function changed in a deploy since create) raised at every clock scan, the decided start
    stuck in ``starting``, the schedule blocked. The tick is not started, and the schedule
    pauses with the error as its reason."""
    env = WorkflowEnvironment(limited_app, start=T0)
    env.schedules.create("kf", keyed, "acme", every=timedelta(hours=1))
    doc = _doc(env, "kf")
    env.store.replace({k: v for k, v in doc.items() if k != "_etag"} | {"payload": {"args": [None], "kwargs": {}}},
                      if_match=doc["_etag"])  # fmt: skip
    env.advance(timedelta(hours=3))
    assert _runs(env, "kf") == {}
    info = env.schedules.get("kf")
    assert info is not None and info.paused and info.next_fire is None
    assert info.paused_reason is not None and "limit key failed: AttributeError" in info.paused_reason
    assert _doc(env, "kf")["starting"] == []


def test_a_long_outage_does_not_make_beat_miss_the_ticks_after_it_is_back() -> None:
    """Broken: a firing looked at most 100 ticks, missed ones included; after a day down, a
    schedule every second had 86,400 ticks to count missed at 100 a scan (one a second): beat,
    back, spent 14 minutes counting and the ticks while it did were late past the catch-up
    window, counted missed too. Missed ticks are now counted 10,000 a firing (no start, no write
    per tick), so the outage is crossed in seconds and the ticks after it run."""
    clock = FakeClock(T0.timestamp())
    eng = Engine(MemoryStore(), InlineDispatcher(), registry=durable.registry, settings=Settings(), clock=clock)
    manage.create(eng, "fast", {
        "every": 1.0, "cron": None, "tz": "UTC", "start_at": None, "end_at": None, "overlap": "allow_all",
        "catchup_window": 300.0, "jitter": 0.0, "pause_on_failure": False, "workflow": "sb.job",
        "payload": {"args": [], "kwargs": {}},
    }, "test")  # fmt: skip
    clock.advance(86_400)  # beat down a day
    back = clock.now()
    for _ in range(60):  # a minute of clock scans, a second apart
        clock.advance(1)
        fire_due(eng)
    after = [tick_execution_id("fast", back + s) for s in range(1, 60)]
    assert all(eng.store.read(eid, EXEC_ID) is not None for eid in after)


# --- held -----------------------------------------------------------------------------------


class _Faulty:
    """Makes the ``at``-th store call raise StoreError (``after``: once the write was applied, an
    answer lost on the way back); counts the calls."""

    METHODS = ("read", "replace", "create", "delete", "scan_due", "query_partition", "upsert")

    def __init__(self, env: WorkflowEnvironment, at: int, after: bool) -> None:
        self.store, self.at, self.after, self.calls = env.store, at, after, 0
        for name in self.METHODS:
            if hasattr(self.store, name):
                setattr(self.store, name, self._wrap(getattr(self.store, name)))

    def _wrap(self, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls != self.at:
                return real(*args, **kwargs)
            if self.after:
                real(*args, **kwargs)
            raise StoreError(f"injected fault at store call {self.at}")

        return call

    def heal(self) -> None:
        for name in self.METHODS:
            self.store.__dict__.pop(name, None)


def _faulted_firing(at: int, after: bool) -> tuple[WorkflowEnvironment, int]:
    env = _env()
    env.schedules.create("ft", job, every=60, overlap="allow_all")
    env.clock.advance(3 * 60 + 1)  # three ticks due
    faulty = _Faulty(env, at, after)
    try:
        fire_due(env.engine)
    except StoreError:
        pass  # the scan's own query failed: beat logs it and scans again
    faulty.heal()
    return env, faulty.calls


@pytest.mark.parametrize("after", [False, True], ids=["before-the-write", "answer-lost"])
def test_a_store_fault_at_any_call_of_a_firing_loses_and_doubles_nothing(after: bool) -> None:
    """Held: a StoreError at each store call of a firing in turn (raised before the call, or after
    a write was applied): the next clock scan starts each due tick once, counted once."""
    _, calls = _faulted_firing(0, after)  # a clean firing: how many store calls it makes
    assert calls > 5
    for at in range(1, calls + 1):
        env, _ = _faulted_firing(at, after)
        env.advance(2)  # the next scans
        # an execution created whose first drive was lost with the fault: recovery drives it
        env.clock.advance(env.engine.settings.drive_timeout + 1)
        env.engine.recovery.scan()
        env.run_until_idle()
        ticks = {f"ft@{(T0 + timedelta(minutes=m)).strftime('%Y%m%dT%H%M%S')}" for m in (1, 2, 3)}
        assert _runs(env, "ft") == dict.fromkeys(ticks, "completed"), at
        doc = _doc(env, "ft")
        assert doc["counts"] == {"started": 3} and doc["starting"] == [], at


def test_a_paused_or_finished_schedule_is_never_due() -> None:
    """Held: an idle system sends no message: a paused schedule, and one past its ``end_at``, are
    not due, and no firing rewrites them however long the clock runs."""
    env = _env()
    env.schedules.create("idle", job, every=60)
    env.schedules.pause("idle")
    env.schedules.create("over", job, every=60, end_at=T0 + timedelta(minutes=2))
    env.advance(timedelta(minutes=5))
    assert env.store.scan_due("schedule", float("inf"), 10) == []
    etags = (_doc(env, "idle")["_etag"], _doc(env, "over")["_etag"])
    env.advance(timedelta(hours=5))
    assert (_doc(env, "idle")["_etag"], _doc(env, "over")["_etag"]) == etags


def test_a_backfill_out_of_range_is_refused_and_records_nothing() -> None:
    """Held: a backfill whose range no date can hold is a ConfigurationError or a clear refusal,
    and no ``backfill`` action is recorded."""
    env = _env()
    env.schedules.create("bb", job, every=60)
    with pytest.raises(ConfigurationError):
        env.schedules.backfill("bb", T0, T0 - timedelta(hours=1))
    with pytest.raises(ConfigurationError):
        env.schedules.backfill("bb", float("nan"), 10.0)
    assert [a["action"] for a in env.schedules.get("bb").actions] == ["create"]  # type: ignore[union-attr]


def test_two_beats_with_skewed_clocks_start_each_tick_once() -> None:
    """Held: two beats on one store, one's clock 40 s ahead of the other's, scanning in turn for
    two hours of ticks every minute (skip and allow_all): each tick starts one execution."""
    env = _env()
    env.schedules.create("sk-all", job, every=60, overlap="allow_all")
    env.schedules.create("sk-one", job, 90.0, every=60)
    ahead = FakeClock(env.clock.t + 40)
    other = Engine(env.store, InlineDispatcher(), settings=env.engine.settings, registry=durable.registry, clock=ahead)
    for _ in range(2 * 60 * 4):  # every 15 s of the slow clock
        env.clock.t += 15
        ahead.t = env.clock.t + 40
        fire_due(other)
        env.advance(0)
    ticks = {f"sk-all@{_stamp(m)}" for m in range(1, 121)}
    assert ticks <= set(_runs(env, "sk-all")) and len(_runs(env, "sk-all")) in (120, 121)
    assert env.schedules.get("sk-all").counts == {"started": len(_runs(env, "sk-all"))}  # type: ignore[union-attr]
    counts = env.schedules.get("sk-one").counts  # type: ignore[union-attr]
    assert counts["started"] == len(_runs(env, "sk-one")) and counts["started"] + counts["skipped"] in (120, 121)


def test_an_operator_pause_racing_a_firing_wins_and_nothing_starts() -> None:
    """Held: a pause written between a firing's read and its decision write: the firing's write
    loses on the etag, it decides again on the paused schedule, and starts nothing."""
    env = _env()
    env.schedules.create("race", job, every=60)
    env.clock.advance(61)
    real = env.store.replace
    paused: list[bool] = []

    def racing(doc: Any, *args: Any, **kwargs: Any) -> Any:
        if doc.get("pk") == SCHEDULES_PK and doc.get("starting") and not paused:
            paused.append(env.schedules.pause("race", reason="racing"))
        return real(doc, *args, **kwargs)

    env.store.replace = racing  # type: ignore[method-assign]
    assert fire_due(env.engine) == 0
    assert paused == [True] and _runs(env, "race") == {}
    assert _doc(env, "race")["starting"] == [] and _doc(env, "race")["counts"] == {}


def test_a_delete_racing_a_firing_keeps_the_decided_start_and_raises_nothing() -> None:
    """Held: the schedule deleted between a firing's decision and its starts: the decided tick is
    created (it was decided), the firing's second write finds nothing and gives up quietly."""
    env = _env()
    env.schedules.create("gone", job, every=60)
    env.clock.advance(61)
    real = env.engine.create_execution

    def deleting(*args: Any, **kwargs: Any) -> bool:
        env.schedules.delete("gone")
        return real(*args, **kwargs)

    env.engine.create_execution = deleting  # type: ignore[method-assign]
    assert fire_due(env.engine) == 1
    env.engine.create_execution = real  # type: ignore[method-assign]
    env.run_until_idle()
    assert _runs(env, "gone") == {f"gone@{_stamp(1)}": "completed"} and env.schedules.get("gone") is None


def test_a_cron_across_the_autumn_night_fires_a_repeated_time_once() -> None:
    """Held: 01:30 happens twice in New York on 1 November 2026; it fires once, at its first
    occurrence (05:30 UTC, EDT), and the day after at 06:30 UTC (EST)."""
    env = WorkflowEnvironment(durable, start=datetime(2026, 10, 31, 12, tzinfo=UTC))
    env.schedules.create("ny", job, cron="30 1 * * *", tz="America/New_York")
    env.advance(timedelta(days=2))
    assert sorted(_runs(env, "ny")) == ["ny@20261101T053000", "ny@20261102T063000"]


def test_the_ui_escapes_a_hostile_name_and_reason_and_refuses_an_unknown_one(tmp_path: Any) -> None:
    """Held: a schedule named like an HTML tag, paused with a script as reason, is shown escaped;
    its buttons act on it; a 100,000-character name is a 404; a message code not in the list is
    not echoed."""
    from starlette.testclient import TestClient

    from celery_durable.stores.sqlite.store import SqliteStore
    from celery_durable.ui import create_app
    from tests.ui import flows
    from tests.ui.conftest import TOKEN, login

    env = WorkflowEnvironment(flows.durable, store=SqliteStore(str(tmp_path / "ui.db")))
    name = "<img src=x onerror=alert(1)>"
    env.schedules.create(name, flows.echo, "hi", every=timedelta(hours=1))
    env.schedules.pause(name, reason="<script>alert(2)</script>")
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False) as client:
        csrf = login(client)
        page = client.get("/schedules").text
        assert "<img src=x" not in page and "<script>alert(2)" not in page and "&lt;img src=x" in page
        resumed = client.post("/schedules/actions/resume", data={"name": name, "csrf": csrf})
        assert resumed.headers["location"] == "/schedules?msg=resumed"
        assert client.post("/schedules/actions/pause", data={"name": "x" * 100_000, "csrf": csrf}).status_code == 404
        assert "<script>" not in client.get("/schedules?msg=<script>").text
    assert env.schedules.get(name).paused is False  # type: ignore[union-attr]
