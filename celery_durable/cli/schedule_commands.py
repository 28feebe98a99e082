"""``celery -A proj durable schedule list|show|pause|resume|trigger|backfill|delete``: managed
schedules (``durable.schedules``: celery_durable/schedules.py); the ones declared in code
(``Durable.schedule``) are listed too, read-only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.cli.render import print_table
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.wording import ts
from celery_durable.engine.schedules.manage import ScheduleInfo
from celery_durable.engine.schedules.spec import OVERLAPS
from celery_durable.errors import DurableError

__all__ = ["schedule"]


@click.group()
def schedule() -> None:
    """Managed schedules: list, show, pause, resume, trigger, backfill, delete."""


def view(info: ScheduleInfo) -> dict[str, Any]:
    """What an operator reads of a schedule (times as ``…_at``: ISO strings under ``--json``)."""
    out = info.as_json()
    out["next_fire_at"] = out.pop("next_fire")
    out["last_started_at"] = out.pop("last_at")
    return out


def _get(ctx: click.Context, name: str) -> ScheduleInfo:
    info = durable_of(ctx).schedules.get(name)
    if info is None:
        raise click.ClickException(f"no schedule named {name!r}")
    return info


@schedule.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="one JSON document per schedule, a line each")
@click.pass_context
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule: managed ones and those declared in code (kind ``code``)."""
    found = durable_of(ctx).schedules.list()
    if as_json:
        for info in found:
            json_out.echo(view(info), indent=None)
        return
    print_table(
        ["NAME", "KIND", "WORKFLOW", "WHEN", "OVERLAP", "NEXT FIRE", "LAST RUN", "STATUS", "PAUSED"],
        [
            [i.name, i.kind, i.workflow, i.spec, i.overlap if i.kind == "managed" else "-", ts(i.next_fire),
             i.last_execution or "-", i.last_status or "-", "yes" if i.paused else "no"]
            for i in found
        ],
    )  # fmt: skip


@schedule.command(name="show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One schedule: its timing, policy, counts, running executions and latest actions."""
    data = view(_get(ctx, name))
    if as_json:
        json_out.echo(data)
        return
    for key in ("name", "kind", "workflow", "spec", "tz", "overlap", "catchup_window", "jitter", "pause_on_failure"):
        click.echo(f"{key:17} {data[key]}")
    click.echo(f"{'paused':17} {'yes: ' + str(data['paused_reason'] or '') if data['paused'] else 'no'}")
    click.echo(f"{'next fire':17} {ts(data['next_fire_at'])}")
    click.echo(f"{'last run':17} {data['last_execution'] or '-'} {data['last_status'] or ''}")
    click.echo(f"{'running':17} {', '.join(data['running']) or '-'}")
    click.echo(f"{'counts':17} {', '.join(f'{k} {v}' for k, v in sorted(data['counts'].items())) or '-'}")
    for action in data["actions"]:
        reason = f" ({action['reason']})" if action.get("reason") else ""
        click.echo(f"  {ts(action['at'])} {action['action']} by {action['by']}{reason}")


def _act(ctx: click.Context, name: str, action: str, as_json: bool, **kwargs: Any) -> Any:
    try:
        result = getattr(durable_of(ctx).schedules, action)(name, **kwargs)
    except DurableError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        json_out.echo({"schedule": name, "action": action, "result": result})
    return result


@schedule.command(name="pause")
@click.argument("name")
@click.option("--reason", default=None, help="recorded with the action")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_pause(ctx: click.Context, name: str, reason: str | None, as_json: bool) -> None:
    """Pause a schedule: no tick fires until resumed."""
    if not _act(ctx, name, "pause", as_json, reason=reason, by=actor()) and not as_json:
        click.echo("already paused")
    elif not as_json:
        click.echo("paused: no tick fires until `durable schedule resume`")


@schedule.command(name="resume")
@click.argument("name")
@click.option("--reason", default=None, help="recorded with the action")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_resume(ctx: click.Context, name: str, reason: str | None, as_json: bool) -> None:
    """Resume a paused schedule from its next tick (the ticks of the pause: `backfill`)."""
    if not _act(ctx, name, "resume", as_json, reason=reason, by=actor()) and not as_json:
        click.echo("not paused")
    elif not as_json:
        click.echo("resumed")


@schedule.command(name="trigger")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_trigger(ctx: click.Context, name: str, as_json: bool) -> None:
    """Start one execution now, by the schedule's overlap policy."""
    started = _act(ctx, name, "trigger", as_json, by=actor())
    if not as_json:
        click.echo(f"started {started}" if started else "not started: the overlap policy skipped or kept it")


def _when(value: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
    except ValueError:  # a clear error, not a traceback
        raise click.BadParameter(f"{value!r} is not an ISO time (2026-01-01T00:00:00+00:00)") from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{value!r} needs a UTC offset (2026-01-01T00:00:00+00:00)")
    return at


@schedule.command(name="backfill")
@click.argument("name")
@click.argument("start")
@click.argument("end")
@click.option("--overlap", type=click.Choice(OVERLAPS), default=None, help="default: the schedule's policy")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_backfill(ctx: click.Context, name: str, start: str, end: str, overlap: str | None, as_json: bool) -> None:
    """Run the ticks in [START, END) now (ISO times with an offset), oldest first."""
    started = _act(ctx, name, "backfill", as_json, start=_when(start), end=_when(end), overlap=overlap, by=actor())
    if not as_json:
        click.echo(f"{len(started)} started" + "".join(f"\n  {e}" for e in started))


@schedule.command(name="delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="do not ask")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def schedule_delete(ctx: click.Context, name: str, yes: bool, as_json: bool) -> None:
    """Delete a managed schedule (the executions it started go on)."""
    json_out.needs_yes(as_json, yes)
    if not yes:
        click.confirm(f"delete schedule {name!r}?", abort=True)
    if not _act(ctx, name, "delete", as_json) and not as_json:
        raise click.ClickException(f"no schedule named {name!r}")
    if not as_json:
        click.echo("deleted")
