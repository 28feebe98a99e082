"""Managed schedules (issue 27 §1) in ``WorkflowEnvironment``: every overlap policy, the catch-up
window, jitter, time zones across DST, pause/resume, trigger, backfill, pause on failure, update,
delete, checks at create, and the schedules declared in code listed beside them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.engine.schedules.firing import schedule_id
from celery_durable.engine.schedules.spec import jitter_of, parse_cron
from celery_durable.errors import ConfigurationError, DurableError, InvalidWorkflowId, WorkflowCancelledError
from celery_durable.schedules import cron_of
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("managed-schedule-tests", set_as_current=False)
durable = Durable(app, store="memory://")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = 3600.0


@durable.workflow(name="ms.job")
def job(seconds: float = 0.0, fail: bool = False) -> str:
    try:
        if seconds:
            wf.sleep(seconds)
    except WorkflowCancelledError:
        raise
    if fail:
        raise ValueError("boom")
    return wf.execution_id()


durable.schedule("code-declared", job, timedelta(hours=6))


def _env(start: datetime = T0) -> WorkflowEnvironment:
    return WorkflowEnvironment(durable, start=start)


def _runs(env: WorkflowEnvironment, prefix: str) -> dict[str, Any]:
    """The executions of schedule ``prefix``: id -> (status, created at, hours after T0)."""
    found = env.list_executions(limit=200).executions
    return {
        e.id: (str(e.status), round((e.created_at - T0.timestamp()) / HOUR, 4))
        for e in found
        if e.id.startswith(prefix + "@")
    }


def _at(hours: float) -> str:
    return (T0 + timedelta(hours=hours)).strftime("%Y%m%dT%H%M%S")


def test_allow_all_starts_every_tick_even_while_the_last_runs() -> None:
    env = _env()
    env.schedules.create("all", job, 2.5 * HOUR, every=timedelta(hours=1), overlap="allow_all")
    env.advance(timedelta(hours=3))
    runs = _runs(env, "all")
    assert runs == {
        f"all@{_at(1)}": ("running", 1.0),
        f"all@{_at(2)}": ("running", 2.0),
        f"all@{_at(3)}": ("running", 3.0),
    }
    assert env.schedules.get("all").counts == {"started": 3}  # type: ignore[union-attr]


def test_skip_records_the_ticks_that_found_the_last_one_running() -> None:
    env = _env()
    env.schedules.create("sk", job, 1.5 * HOUR, every=timedelta(hours=1))  # skip is the default
    env.advance(timedelta(hours=3))
    assert _runs(env, "sk") == {f"sk@{_at(1)}": ("completed", 1.0), f"sk@{_at(3)}": ("running", 3.0)}
    info = env.schedules.get("sk")
    assert info is not None and info.counts == {"started": 2, "skipped": 1}
    assert info.overlap == "skip" and info.last_execution == f"sk@{_at(3)}" and info.last_status == "running"


def test_buffer_one_keeps_the_latest_tick_and_starts_it_when_the_running_one_ends() -> None:
    env = _env()
    env.schedules.create("buf", job, 2.5 * HOUR, every=timedelta(hours=1), overlap="buffer_one")
    env.advance(timedelta(hours=4))
    runs = _runs(env, "buf")
    # 01:00 runs until 03:30; 02:00 is kept, then replaced by 03:00 (dropped), which starts once
    # 01:00 ended: at the next recheck, within a clock interval (1 s)
    assert set(runs) == {f"buf@{_at(1)}", f"buf@{_at(3)}"}
    assert runs[f"buf@{_at(1)}"] == ("completed", 1.0)
    status, started = runs[f"buf@{_at(3)}"]
    assert status == "running" and 3.5 <= started <= 3.5 + 1.5 / HOUR  # started rounded to 0.36 s
    info = env.schedules.get("buf")
    assert info is not None and info.counts == {"started": 2, "dropped": 1}


def test_cancel_other_cancels_the_running_one_then_starts_the_tick() -> None:
    env = _env()
    env.schedules.create("co", job, 2.5 * HOUR, every=timedelta(hours=1), overlap="cancel_other")
    env.advance(timedelta(hours=2, seconds=5))
    runs = _runs(env, "co")
    assert runs[f"co@{_at(1)}"][0] == "cancelled"
    status, started = runs[f"co@{_at(2)}"]
    assert status == "running" and 2.0 <= started <= 2.0 + 1.5 / HOUR
    cancelled = env.handle(f"co@{_at(1)}").poll()
    assert cancelled.status == "cancelled"


def test_the_catch_up_window_skips_ticks_missed_longer_ago() -> None:
    env = _env()
    env.schedules.create("cu", job, every=timedelta(hours=1), catchup_window=timedelta(minutes=90), overlap="allow_all")
    env.clock.advance(5 * HOUR + 60)  # beat was down for 5 hours: nothing fired meanwhile
    env.advance(0)
    # at 05:01 the ticks 01:00-03:00 are more than 90 minutes late; 04:00 and 05:00 are not
    assert _runs(env, "cu") == {f"cu@{_at(4)}": ("completed", 5.0167), f"cu@{_at(5)}": ("completed", 5.0167)}
    info = env.schedules.get("cu")
    assert info is not None and info.counts == {"missed": 3, "started": 2}


def test_jitter_delays_each_tick_by_its_own_fixed_amount() -> None:
    env = _env()
    env.schedules.create("ji", job, every=timedelta(hours=1), jitter=timedelta(minutes=10))
    env.advance(timedelta(hours=3, minutes=10))
    runs = _runs(env, "ji")
    assert len(runs) == 3
    delays = []
    for hours in (1, 2, 3):
        tick = T0.timestamp() + hours * HOUR
        expected = jitter_of("ji", tick, 600.0)
        assert 0 <= expected < 600
        _, started = runs[f"ji@{_at(hours)}"]
        assert started == round(hours + expected / HOUR, 4)
        delays.append(expected)
    assert len(set(delays)) == 3  # not one delay for all


def test_cron_in_a_time_zone_across_the_spring_forward_night() -> None:
    start = datetime(2026, 3, 28, 12, tzinfo=UTC)
    env = _env(start)
    env.schedules.create("dst", job, cron="30 2 * * *", tz="Europe/Paris")
    env.advance(timedelta(days=2))
    ids = sorted(e.id for e in env.list_executions().executions if e.id.startswith("dst@"))
    # 02:30 does not exist in Paris on 29 March 2026: it fires at 03:00 CEST (01:00 UTC);
    # the next night 02:30 CEST is 00:30 UTC
    assert ids == ["dst@20260329T010000", "dst@20260330T003000"]


def test_cron_weekdays_in_a_zone_and_a_celery_crontab() -> None:
    start = datetime(2026, 12, 4, 12, tzinfo=UTC)  # a Friday
    env = _env(start)
    env.schedules.create("wk", job, cron=crontab(minute="0", hour="9", day_of_week="mon-fri"), tz="Europe/Paris")
    env.advance(timedelta(days=4))
    ids = sorted(e.id for e in env.list_executions().executions if e.id.startswith("wk@"))
    assert ids == ["wk@20261207T080000", "wk@20261208T080000"]  # Monday and Tuesday, 09:00 CET
    assert env.schedules.get("wk").spec == "cron 0 9 * * mon-fri (Europe/Paris)"  # type: ignore[union-attr]


@pytest.mark.parametrize("expr", ["*/15 9-17 * * mon-fri", "0 0 1,15 * *", "5-59/20 3 * jan-mar sun", "0 12 * * 0,6"])
def test_the_cron_reader_agrees_with_celery_crontab(expr: str) -> None:
    minute, hour, dom, month, dow = expr.split()
    c = crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow)
    assert parse_cron(expr) == (c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week)
    assert cron_of(c) == expr


def test_the_cron_reader_takes_7_as_sunday_and_refuses_what_it_cannot_read() -> None:
    assert parse_cron("0 0 * * 7")[4] == parse_cron("0 0 * * sun")[4] == frozenset({0})
    for bad in ("0 0 * * 8", "0 0 0 * *", "0 0 * 13 *", "*/0 * * * *", "a * * * *", "0 0 * * mon-"):
        with pytest.raises(ConfigurationError):
            parse_cron(bad)


def test_pause_and_resume_are_recorded_and_no_tick_fires_while_paused() -> None:
    env = _env()
    env.schedules.create("pr", job, every=timedelta(hours=1))
    assert env.schedules.pause("pr", reason="maintenance", by="ops") is True
    assert env.schedules.pause("pr") is False
    env.advance(timedelta(hours=3))
    assert _runs(env, "pr") == {}
    info = env.schedules.get("pr")
    assert info is not None and info.paused and info.paused_reason == "maintenance" and info.next_fire is None
    assert env.schedules.resume("pr", by="ops") is True
    assert env.schedules.resume("pr") is False
    env.advance(timedelta(hours=1))
    assert _runs(env, "pr") == {f"pr@{_at(4)}": ("completed", 4.0)}
    actions = [(a["action"], a["by"]) for a in env.schedules.get("pr").actions]  # type: ignore[union-attr]
    assert actions[1:] == [("pause", "ops"), ("resume", "ops")]


def test_trigger_starts_now_by_the_overlap_policy_even_when_paused() -> None:
    env = _env()
    env.schedules.create("tr", job, HOUR, every=timedelta(days=1))
    env.schedules.pause("tr")
    first = env.schedules.trigger("tr")
    assert first is not None and first.startswith("tr@20260101T000000.")
    env.run_until_idle()
    assert env.handle(first).status() == "running"
    assert env.schedules.trigger("tr") is None  # skip: the first still runs
    env.advance(timedelta(hours=1, seconds=1))
    second = env.schedules.trigger("tr")
    assert second is not None and second != first
    assert env.schedules.get("tr").counts == {"started": 2, "skipped": 1}  # type: ignore[union-attr]


def test_backfill_runs_past_ticks_once_each() -> None:
    env = _env(T0 + timedelta(days=1))
    env.schedules.create("bf", job, every=timedelta(hours=6))
    started = env.schedules.backfill("bf", T0, T0 + timedelta(days=1), overlap="allow_all")
    assert started == [f"bf@{_at(h)}" for h in (0, 6, 12, 18)]
    env.run_until_idle()
    assert {s for s, _ in _runs(env, "bf").values()} == {"completed"}
    again = env.schedules.backfill("bf", T0, T0 + timedelta(days=1), overlap="allow_all")
    assert again == started and len(_runs(env, "bf")) == 4  # the same ids: none started twice


def test_backfill_by_skip_starts_the_first_and_skips_the_rest() -> None:
    env = _env(T0 + timedelta(days=1))
    env.schedules.create("bs", job, HOUR, every=timedelta(hours=6))
    assert env.schedules.backfill("bs", T0, T0 + timedelta(hours=13)) == [f"bs@{_at(0)}"]
    assert env.schedules.get("bs").counts == {"started": 1, "skipped": 2}  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="start < end"):
        env.schedules.backfill("bs", T0 + timedelta(hours=1), T0)


def test_pause_on_failure_pauses_the_schedule_with_the_failure_as_reason() -> None:
    env = _env()
    env.schedules.create("pf", job, 0.0, True, every=timedelta(hours=1), pause_on_failure=True)
    env.advance(timedelta(hours=1))
    assert _runs(env, "pf") == {f"pf@{_at(1)}": ("failed", 1.0)}
    env.advance(timedelta(hours=3))  # the next tick sees the failure: paused, nothing more starts
    assert len(_runs(env, "pf")) == 1
    info = env.schedules.get("pf")
    assert info is not None and info.paused
    assert (
        info.paused_reason is not None and f"pf@{_at(1)} failed" in info.paused_reason and "boom" in info.paused_reason
    )
    assert info.actions[-1]["by"] == "pause_on_failure"


def test_without_pause_on_failure_a_failure_changes_nothing() -> None:
    env = _env()
    env.schedules.create("nf", job, 0.0, True, every=timedelta(hours=1))
    env.advance(timedelta(hours=3))
    assert [s for s, _ in _runs(env, "nf").values()] == ["failed"] * 3


def test_update_changes_timing_and_input_from_now_on() -> None:
    env = _env()
    env.schedules.create("up", job, every=timedelta(hours=1))
    env.advance(timedelta(hours=1))
    env.schedules.update("up", every=timedelta(minutes=30), args=(0.0,), kwargs={"fail": True})
    env.advance(timedelta(hours=1))
    runs = _runs(env, "up")
    assert runs == {
        f"up@{_at(1)}": ("completed", 1.0),
        f"up@{_at(1.5)}": ("failed", 1.5),
        f"up@{_at(2)}": ("failed", 2.0),
    }
    with pytest.raises(ConfigurationError, match="cannot change"):
        env.schedules.update("up", workflow_id="other")
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        env.schedules.update("up", tz="Mars/Olympus")
    env.schedules.update("up", kwargs={})  # the args stay as stored
    doc_payload = env.store.read("sch:all", schedule_id("up"))["payload"]  # type: ignore[index]
    assert doc_payload == {"args": [0.0, True], "kwargs": {}}  # the codec binds keywords to positions
    env.schedules.update("up", cron="0 0 * * *")  # a cron replaces the interval
    assert env.schedules.get("up").spec == "cron 0 0 * * * (UTC)"  # type: ignore[union-attr]


def test_delete_stops_the_ticks_and_keeps_the_executions() -> None:
    env = _env()
    env.schedules.create("de", job, every=timedelta(hours=1))
    env.advance(timedelta(hours=1))
    assert env.schedules.delete("de") is True
    assert env.schedules.delete("de") is False
    env.advance(timedelta(hours=3))
    assert list(_runs(env, "de")) == [f"de@{_at(1)}"]
    assert env.schedules.get("de") is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"every": timedelta(hours=1), "workflow": "no.such"}, "unknown workflow"),
        ({"cron": "61 * * * *"}, "minute"),
        ({"cron": "0 9 * *"}, "5 fields"),
        ({"every": timedelta(hours=1), "tz": "Europe/Atlantis"}, "unknown time zone"),
        ({"every": timedelta(hours=1), "overlap": "queue"}, "overlap must be"),
        ({}, "one of every="),
        ({"every": timedelta(hours=1), "cron": "* * * * *"}, "one of every="),
        ({"every": timedelta(0)}, "every must be > 0"),
        ({"every": 60, "jitter": -1}, "jitter must be >= 0"),
        ({"every": 60, "catchup_window": 5}, "at least 10 seconds"),
        ({"every": 60, "start_at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"every": 60, "pause_on_failure": "yes"}, "True or False"),
    ],
)
def test_create_checks_in_the_caller_and_stores_nothing(kwargs: dict[str, Any], error: str) -> None:
    env = _env()
    workflow = kwargs.pop("workflow", job)
    with pytest.raises(ConfigurationError, match=error):
        env.schedules.create("bad", workflow, **kwargs)
    assert [i.name for i in env.schedules.list()] == ["code-declared"]


def test_an_input_the_codec_refuses_stores_nothing() -> None:
    env = _env()
    with pytest.raises((TypeError, ValueError)):
        env.schedules.create("bad", job, object(), every=60)
    assert env.schedules.get("bad") is None


def test_a_name_in_use_is_refused() -> None:
    env = _env()
    env.schedules.create("one", job, every=60)
    with pytest.raises(ConfigurationError, match="exists"):
        env.schedules.create("one", job, every=120)
    with pytest.raises(ConfigurationError, match="declared in code"):
        env.schedules.create("code-declared", job, every=120)
    with pytest.raises(DurableError, match="schedule name"):
        env.schedules.create("", job, every=120)
    with pytest.raises(DurableError, match="with its ticks"):  # its executions' ids would be too long
        env.schedules.create("n" * 190, job, every=120)


def test_schedules_declared_in_code_are_listed_read_only() -> None:
    env = _env()
    env.schedules.create("managed", job, every=timedelta(hours=1))
    listed = {i.name: i for i in env.schedules.list()}
    assert set(listed) == {"code-declared", "managed"}
    code = listed["code-declared"]
    assert code.kind == "code" and code.workflow == "ms.job" and code.spec == "every 6:00:00"
    assert listed["managed"].kind == "managed"
    for action in (env.schedules.pause, env.schedules.resume, env.schedules.trigger, env.schedules.delete):
        with pytest.raises(ConfigurationError, match="declared in code"):
            action("code-declared")
    env.advance(timedelta(hours=6))  # its tick (beat's) shows as its last run
    code = env.schedules.get("code-declared")  # type: ignore[assignment]
    assert code.last_execution == f"code-declared@{_at(6)}" and code.last_status == "completed"


def test_start_and_end_bound_the_ticks() -> None:
    env = _env()
    env.schedules.create(
        "se", job, every=timedelta(hours=1), start_at=T0 + timedelta(hours=2), end_at=T0 + timedelta(hours=4)
    )
    env.advance(timedelta(hours=6))
    assert set(_runs(env, "se")) == {f"se@{_at(2)}", f"se@{_at(3)}"}
    info = env.schedules.get("se")
    assert info is not None and info.next_fire is None


def test_no_execution_may_take_the_schedules_partition() -> None:
    env = _env()
    with pytest.raises(InvalidWorkflowId, match="reserved"):
        env.start(job, _workflow_id="sch:all")


def test_starts_decided_before_a_pause_are_still_created() -> None:
    """A firer killed between its decision and its starts, then an operator's pause: the decided
    start is created all the same (it was decided before the pause), and no tick after it."""
    env = _env()
    env.schedules.create("kp", job, every=timedelta(hours=1))
    real = env.engine.create_execution

    def killed(*args: Any, **kwargs: Any) -> bool:
        raise KeyboardInterrupt("the firer dies")

    env.engine.create_execution = killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        env.advance(timedelta(hours=1))
    env.engine.create_execution = real  # type: ignore[method-assign]
    assert _runs(env, "kp") == {}
    env.schedules.pause("kp")
    env.advance(timedelta(hours=3))
    assert list(_runs(env, "kp")) == [f"kp@{_at(1)}"]
    assert env.schedules.get("kp").counts == {"started": 1}  # type: ignore[union-attr]


def test_a_kept_tick_waiting_on_a_long_run_is_looked_at_a_recovery_interval_apart() -> None:
    """A kept tick waits for the running execution's end, which does not notify the schedule: its
    document was due (and rewritten) every clock interval, 3,600 writes an hour of a long run. It
    is now looked at after a tenth of the time it has waited, a recovery interval apart at most,
    and still starts within that of the end."""
    env = _env()
    env.schedules.create("slow", job, 5 * HOUR + 1800, every=timedelta(hours=4), overlap="buffer_one")
    sid = schedule_id("slow")
    writes: list[float] = []
    real = env.store.replace

    def counting(doc: Any, if_match: Any = None) -> Any:
        if doc.get("id") == sid:
            writes.append(env.clock.now())
        return real(doc, if_match=if_match)

    env.advance(timedelta(hours=8))  # 04:00 runs until 09:30; 08:00 is kept from 08:00
    env.store.replace = counting  # type: ignore[method-assign]
    for _ in range(3600):  # an hour of beat's clock scan, once a second
        env.clock.advance(1)
        env._scan()
    env.store.replace = real  # type: ignore[method-assign]
    assert len(writes) <= 3600 / env.engine.settings.recovery_interval + 40, len(writes)
    for _ in range(1800 + 30):  # the run ends at 09:30
        env.clock.advance(1)
        env._scan()
    status, started = _runs(env, "slow")[f"slow@{_at(8)}"]
    assert status == "running" and 9.5 <= started <= 9.5 + env.engine.settings.recovery_interval / HOUR + 1e-3
