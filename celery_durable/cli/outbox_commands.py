"""``celery -A proj durable outbox …``: list, show, cancel and retry effect outbox rows; list the problems."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.cli.render import print_table
from celery_durable.engine.admin.wording import ts

__all__ = ["outbox"]

_JSON = click.option("--json", "as_json", is_flag=True, help="print the outcome as JSON (with --yes)")


_durable = durable_of


@click.group()
def outbox() -> None:
    """Effect outbox rows: list, show, cancel, retry; problems across every key."""


def _effect_row(info: Any) -> list[str]:
    return [info.id, info.type, info.key, info.status, f"{info.attempt}/{info.max_attempts}",
            ts(info.created_at), ts(info.completed_at), (info.last_error or info.reason or "")[:60]]  # fmt: skip


_EFFECT_HEADERS = ["EFFECT ID", "TYPE", "KEY", "STATUS", "ATTEMPT", "CREATED", "SETTLED", "LAST ERROR"]


@outbox.command(name="list")
@click.option("--key", required=True, help="the ordering lane to list")
@click.option("--status", default=None, type=click.Choice(["pending", "running", "succeeded", "failed", "cancelled"]))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def outbox_list(ctx: click.Context, key: str, status: str | None, as_json: bool) -> None:
    """Rows of one key, in order (live, settled within retention, failed)."""
    d = _durable(ctx)
    rows = [r for r in d.outbox.rows(key) if status is None or r.status == status]
    if as_json:
        for r in rows:
            json_out.echo(r.__dict__, indent=None)
        return
    if rows:
        print_table(_EFFECT_HEADERS, [_effect_row(r) for r in rows])
    else:
        click.echo("no effects")


@outbox.command(name="show")
@click.argument("effect_id")
@click.option("--json", "as_json", is_flag=True, help="accepted for symmetry: the row is JSON either way")
@click.pass_context
def outbox_show(ctx: click.Context, effect_id: str, as_json: bool) -> None:
    """One effect row, with its payload and last error (JSON)."""
    info = _durable(ctx).outbox.get(effect_id)
    if info is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    json_out.echo(info.__dict__)


@outbox.command(name="cancel")
@click.argument("effect_id", required=False)
@click.option("--key", default=None, help="cancel the pending/running rows of this key")
@click.option("--type", "types", multiple=True, help="with --key: only these effect types")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@_JSON
@click.pass_context
def outbox_cancel(
    ctx: click.Context, effect_id: str | None, key: str | None, types: tuple[str, ...], yes: bool, as_json: bool
) -> None:
    """Cancel one effect by id, or a key's pending and running effects."""
    if (effect_id is None) == (key is None):
        raise click.UsageError("give an EFFECT_ID or --key, not both")
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    if effect_id is not None and d.outbox.get(effect_id) is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    if not yes:
        click.confirm(f"cancel {effect_id or 'the live effects of key ' + str(key)}?", abort=True)
    n = d.outbox.cancel(effect_id, key=key, types=list(types) or None)
    if as_json:
        json_out.echo({"action": "cancel", "effect_id": effect_id, "key": key, "cancelled": n})
    else:
        click.echo(f"cancelled {n}")


@outbox.command(name="retry")
@click.argument("effect_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@_JSON
@click.pass_context
def outbox_retry(ctx: click.Context, effect_id: str, yes: bool, as_json: bool) -> None:
    """Run a failed effect again: a new row (id ``<id>:retry<n>``) with the same type, key and
    payload. The failed row is kept, for the record, and leaves ``outbox problems``. Once per
    failed row: run again, it prints the id of the retry it made (nothing runs twice)."""
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    info = d.outbox.get(effect_id)
    if info is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    if info.status != "failed":
        raise click.ClickException(f"effect {effect_id} is {info.status}, not failed")
    if not yes:
        click.confirm(f"run {info.type} {effect_id} again?", abort=True)
    new_id = d.outbox.retry(effect_id)  # the failed row leaves `outbox problems`
    if as_json:
        json_out.echo({"action": "retry", "effect_id": effect_id, "enqueued": new_id})
    else:
        click.echo(f"enqueued {new_id}")


@outbox.command(name="problems")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), help="at most this many of each")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def outbox_problems(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Effects that failed for good, and lanes and intents the scan has not acted on, across every key."""
    p = _durable(ctx).outbox.problems(limit)
    if as_json:
        json_out.echo(dataclasses.asdict(p))
        return
    more = " (more not shown)"
    if p.failed:
        rows = [[f.id, f.type, f.key, f"{f.attempt}/{f.max_attempts}", ts(f.completed_at),
                 (f.last_error or f.reason or "")[:60]] for f in p.failed]  # fmt: skip
        title = "failed effects, oldest first" + (more if p.more_failed else "")
        print_table(["EFFECT ID", "TYPE", "KEY", "ATTEMPT", "FAILED", "LAST ERROR"], rows, title=title)
    else:
        click.echo("no failed effects")
    if p.stuck:
        rows = [[s.key, s.why, ts(s.due_at), s.effect_id, s.effect_type or ""] for s in p.stuck]
        title = f"stuck: due over {p.grace:g} s, not acted on" + (more if p.more_stuck else "")
        print_table(["KEY", "WHY", "DUE SINCE", "EFFECT ID", "TYPE"], rows, title=title)
    else:
        click.echo("no stuck lanes or intents")
