"""``celery -A proj durable export ID`` and ``durable replay-check``: a history as JSON, and a check
that the workflow code installed here still replays the recorded histories (before a deploy, in CI)."""

from __future__ import annotations

import json
import sys

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.cli.render import print_table
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.schema import Status
from celery_durable.engine.replay.check import Verdict, check_all, export_history
from celery_durable.errors import DurableError

__all__ = ["export", "replay_check"]


@click.command(name="export")
@click.argument("execution_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="write it here (default stdout)")
@click.option("--json", "as_json", is_flag=True, help="with -o: print what was written as JSON (the history is JSON)")
@click.pass_context
def export(ctx: click.Context, execution_id: str, output: str | None, as_json: bool) -> None:
    """The history of EXECUTION_ID as JSON (every document of its partition), for replay-check --from."""
    d = durable_of(ctx)
    try:
        docs = {doc["id"]: doc for doc in d.engine.store.query_partition(execution_id).docs}
    except DurableError as exc:  # a corrupt row, the store down: said, not a traceback
        raise click.ClickException(f"{execution_id}: {type(exc).__name__}: {exc}") from None
    if EXEC_ID not in docs:
        raise click.ClickException(f"no execution with id {execution_id!r}")
    text = json.dumps(export_history(docs), sort_keys=True, indent=1)
    if output is None:
        click.echo(text)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        if as_json:
            json_out.echo({"execution_id": execution_id, "documents": len(docs), "path": output})
        else:
            click.echo(f"{execution_id}: {len(docs)} documents written to {output}")


@click.command(name="replay-check")
@click.option("--workflow", default=None, help="only this workflow's executions")
@click.option(
    "--status",
    default="running",
    show_default=True,
    type=click.Choice([*(str(s) for s in Status), "any"]),
    help="only executions with this status",
)
@click.option("--from", "files", multiple=True, type=click.Path(exists=True, dir_okay=False), help="exported histories")
@click.option("--limit", default=1000, show_default=True, help="check at most this many executions")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def replay_check(
    ctx: click.Context, workflow: str | None, status: str, files: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Replay recorded histories, read-only, against the workflow code installed here: per
    execution compatible, or the first step where the code leaves its history. Exit code 1 when
    any is not compatible (a deploy of this code would fail those executions)."""
    d = durable_of(ctx)
    try:
        found = list(check_all(d.engine, files or None, workflow, None if status == "any" else status, limit))
    except ValueError as exc:  # a file that is not an exported history
        raise click.ClickException(str(exc)) from None
    bad = [v for v in found if not v.ok]
    if as_json:
        json_out.echo({"checked": len(found), "not_compatible": len(bad), "executions": [v.as_json() for v in found]})
    else:
        if found:
            rows = [[v.execution_id, v.workflow, v.status, str(v.verdict), "" if v.step is None else str(v.step),
                     v.history or "", v.code or ""] for v in found]  # fmt: skip
            print_table(["EXECUTION", "WORKFLOW", "STATUS", "VERDICT", "STEP", "HISTORY HAS", "CODE NOW"], rows)
        for v in bad:
            click.echo(f"{v.execution_id}: {v.verdict}: {v.hint or v.detail}")
        counts = {str(k): sum(1 for v in found if v.verdict == k) for k in Verdict}
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        click.echo(f"{len(found)} checked{': ' + summary if summary else ''}")
    if bad:
        sys.exit(1)
