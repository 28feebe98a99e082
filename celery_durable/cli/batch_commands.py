"""``celery -A proj durable batch ACTION --workflow W --status S --search k=v --since 1d``: an
operator action over every execution a query selects, run by the workers as a durable workflow
(engine/admin/batch.py, glue/batch.py): printed is its id; ``--wait`` follows its progress."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.engine.admin import wording
from celery_durable.engine.admin.batch import ACTIONS
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.documents.schema import TERMINAL, Status
from celery_durable.errors import ConfigurationError, InvalidSearchAttribute
from celery_durable.stores.search import parse_pairs

__all__ = ["batch"]


def _search(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any] | None:
    try:
        return parse_pairs(values) or None
    except InvalidSearchAttribute as exc:
        raise click.BadParameter(str(exc)) from exc


def _age(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    try:
        return None if value is None else wording.parse_age(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command(name="batch")
@click.argument("action", type=click.Choice(ACTIONS))
@click.option("--workflow", default=None, help="only this workflow's executions")
@click.option("--status", default=None, type=click.Choice([str(s) for s in Status]), help="only with this status")
@click.option("--search", "search", multiple=True, callback=_search, help="attr=value (repeat to AND)")
@click.option("--since", default=None, callback=_age, help="started at most this long ago (90s, 15m, 2h, 7d)")
@click.option("--reason", default=None, help="recorded with the action on each execution")
@click.option("--step", type=int, default=None, help="reset: the step to reset to")
@click.option("--signal", "signal_name", default=None, help="signal: its name")
@click.option("--value", default="null", help="signal: its value, as JSON")
@click.option("--rate", type=float, default=None, help="at most this many executions per second")
@click.option("--page-size", type=int, default=100, show_default=True)
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--wait", is_flag=True, help="follow its progress until it ends")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def batch(
    ctx: click.Context,
    action: str,
    workflow: str | None,
    status: str | None,
    search: dict[str, Any] | None,
    since: float | None,
    reason: str | None,
    step: int | None,
    signal_name: str | None,
    value: str,
    rate: float | None,
    page_size: int,
    yes: bool,
    wait: bool,
    as_json: bool,
) -> None:
    """Run ACTION on every execution the query selects, as a durable workflow of its own
    (resumable, its progress its custom status: `durable show ID`); refusals are counted and
    named, never stop it."""
    json_out.needs_yes(as_json, yes)
    d = durable_of(ctx)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--value is not JSON: {exc}") from None
    what = " ".join(f"--{k} {v}" for k, v in (("workflow", workflow), ("status", status), ("since", since)) if v)
    if not yes:  # every action changes many executions
        matching = f"{what or 'anything'}{' ' + str(search) if search else ''}"
        click.confirm(f"{action} every execution matching {matching}?", abort=True)
    try:
        handle = d.batch(
            action,
            workflow=workflow,
            status=status,
            search=search,
            since=None if since is None else timedelta(seconds=since),
            reason=reason,
            by=actor(),
            step=step,
            signal=signal_name,
            value=parsed,
            rate=rate,
            page_size=page_size,
        )
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    if not wait:
        if as_json:
            json_out.echo({"id": handle.id, "action": action})
        else:
            click.echo(f"batch {handle.id} started: `durable show {handle.id}` for its progress")
        return
    seen = None
    while True:
        info = handle.poll()
        progress = info.custom_status
        if progress != seen and not as_json:
            click.echo(f"{info.status}: {progress}")
            seen = progress
        if info.status in TERMINAL:
            break
        time.sleep(0.5)
    if as_json:
        json_out.echo({"id": handle.id, "action": action, "status": info.status, "result": info.result})
    if info.status != Status.COMPLETED:
        raise click.ClickException(f"batch {handle.id} {info.status}")
