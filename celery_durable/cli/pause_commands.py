"""``celery -A proj durable pause ID`` and ``durable unpause ID``: hold an execution where it is
(nothing of it replayed, no new step or activity) and let it go on (engine/admin/pause.py)."""

from __future__ import annotations

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.engine.admin.oplog import actor
from celery_durable.errors import DurableError

__all__ = ["pause", "unpause"]


def _run(ctx: click.Context, action: str, execution_id: str, reason: str | None, as_json: bool) -> None:
    d = durable_of(ctx)
    try:
        changed = getattr(d, action)(execution_id, by=actor(), reason=reason)
    except DurableError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        json_out.echo({"id": execution_id, "action": action, "changed": changed})
    elif changed:
        click.echo(
            f"{action}d" + (": nothing of it runs until `durable unpause`" if action == "pause" else ": driven now")
        )
    else:
        click.echo(f"already {'paused' if action == 'pause' else 'not paused'}")


@click.command()
@click.argument("execution_id")
@click.option("--reason", default=None, help="recorded with the action")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def pause(ctx: click.Context, execution_id: str, reason: str | None, as_json: bool) -> None:
    """Pause an execution: no new step or activity until unpaused; what arrives (outcomes, timers,
    signals) is recorded meanwhile. A running activity goes on."""
    _run(ctx, "pause", execution_id, reason, as_json)


@click.command()
@click.argument("execution_id")
@click.option("--reason", default=None, help="recorded with the action")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def unpause(ctx: click.Context, execution_id: str, reason: str | None, as_json: bool) -> None:
    """Unpause an execution and drive it now."""
    _run(ctx, "unpause", execution_id, reason, as_json)
