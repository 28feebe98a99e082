"""``celery -A proj durable update ID NAME --value JSON``: send an update to a running workflow and
print its handler's answer once a worker handled it (``WorkflowHandle.update``)."""

from __future__ import annotations

import json

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.errors import DurableError

__all__ = ["update"]


@click.command()
@click.argument("execution_id")
@click.argument("name")
@click.option("--value", "values", multiple=True, help="an argument of the handler, as JSON (repeat for several)")
@click.option("--timeout", default=30.0, show_default=True, help="seconds to wait for a worker to handle it")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def update(
    ctx: click.Context, execution_id: str, name: str, values: tuple[str, ...], timeout: float, as_json: bool
) -> None:
    """Send update NAME (its arguments: --value JSON ...) and print the answer; exit status 1 when
    it is rejected, fails, is refused (the execution ended) or is not handled in time (the request
    stays: a worker may still handle it)."""
    try:
        args = [json.loads(v) for v in values]
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"--value is not valid JSON: {exc}") from exc
    d = durable_of(ctx)
    try:
        answer = d.update(execution_id, name, *args, timeout=timeout)
    except (DurableError, ValueError, TypeError) as exc:  # a bad name or timeout too: nothing was sent
        raise click.ClickException(str(exc)) from None
    if as_json:
        json_out.echo({"id": execution_id, "action": "update", "name": name, "answer": answer})
    else:
        click.echo(json.dumps(answer))
