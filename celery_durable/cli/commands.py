"""``celery -A proj durable …``: list, show, signal, cancel, resume, retry and purge executions.

Registered through the ``celery.commands`` entry point, so it runs with the app, config and
store of the project, like ``celery inspect``. A thin layer over the read model and operations
of :mod:`celery_durable.engine.admin.operator`: it parses and validates input (bad input exits 2),
formats rich tables (:mod:`.render`; ``--json`` for scripts) and asks for confirmation of
destructive commands unless ``--yes``. Errors of the library (configuration, store, refused
operations) are one line on stderr and exit 1; a document that cannot be decoded is flagged in
the output, never fatal.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from celery_durable.app import Durable
from celery_durable.cli import json_out
from celery_durable.cli import operator_actions as cli_ops
from celery_durable.cli import render as cli_render
from celery_durable.cli.context import durable_of
from celery_durable.cli.render import print_table
from celery_durable.engine.admin import wording
from celery_durable.engine.admin.operator import (
    ExecutionDetail,
    ExecutionSummary,
    OperationRefused,
    PurgeReport,
    StepRecord,
)
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.wording import escape, prompt, ts
from celery_durable.engine.documents.schema import Status
from celery_durable.engine.signals.inbox import declared_signals
from celery_durable.errors import DurableError, InvalidSearchAttribute, PayloadValidationError, UnknownWorkflowError
from celery_durable.stores.base import MAX_PAGE_SIZE
from celery_durable.stores.search import parse_pairs

__all__ = ["durable", "parse_age"]

_STATUSES = [str(s) for s in Status]
_JSON = click.option("--json", "as_json", is_flag=True, help="print the outcome as JSON (destructive: with --yes)")


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` (or plain seconds) → seconds (bad: exit 2)."""
    try:
        return wording.parse_age(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _age_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    return None if value is None else parse_age(value)


def _cell(value: Any) -> str:
    """A value on a line of its own: ``-`` for None, control characters escaped."""
    return escape("-" if value is None else str(value))


class _Group(click.Group):
    """Library errors leave as one line on stderr and exit 1 (no traceback), whatever the command;
    so does an OS error (a file the store cannot open, a refused socket) a store did not wrap."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UnknownWorkflowError as exc:
            raise click.ClickException(str(exc)) from exc
        except DurableError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


def _durable(ctx: click.Context) -> Durable:
    return durable_of(ctx)


def _describe(d: Durable, execution_id: str) -> ExecutionDetail:
    try:
        return d.describe(execution_id)
    except UnknownWorkflowError as exc:
        raise click.ClickException(f"unknown execution id {execution_id!r}") from exc


def _search_option(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any] | None:
    """``attr=value`` pairs (:func:`parse_pairs`)."""
    try:
        return parse_pairs(values) or None
    except InvalidSearchAttribute as exc:
        raise click.BadParameter(str(exc)) from exc


@click.group(name="durable", cls=_Group)
@click.pass_context
def durable(ctx: click.Context) -> None:
    """Inspect and operate durable workflow executions."""


@durable.command(name="list")
@click.option("--status", type=click.Choice(_STATUSES), default=None)
@click.option("--workflow", default=None, help="only executions of this workflow name")
@click.option("--older-than", callback=_age_option, help="created before this age ago (e.g. 2h)")
@click.option("--newer-than", "--since", callback=_age_option, help="created within this age (e.g. 15m)")
@click.option(
    "--search",
    "search",
    multiple=True,
    callback=_search_option,
    help="attr=value (repeat to AND); 3, 1.5, true, false are typed, quote a string: 'n=\"3\"'",
)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="at most this many")
@click.option("--cursor", default=None, help="continue a previous listing (printed when more remain)")
@click.option("--json", "as_json", is_flag=True, help="JSON lines for scripts")
@click.pass_context
def list_(
    ctx: click.Context,
    status: str | None,
    workflow: str | None,
    older_than: float | None,
    newer_than: float | None,
    search: dict[str, Any] | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List executions, newest first (read page by page, never one read per execution); with
    --search, by search attributes (the cost grows with the matches, not with the store)."""
    d = _durable(ctx)
    now = d.engine.clock.now()
    before = None if older_than is None else now - older_than
    after = None if newer_than is None else now - newer_than
    rows: list[ExecutionSummary] = []
    while len(rows) < limit:
        page = d.executions(workflow, status, min(limit - len(rows), MAX_PAGE_SIZE), cursor, after, before, search)
        rows += page.executions
        cursor = page.cursor
        if cursor is None:
            break
    if as_json:
        for r in rows:
            json_out.echo(dataclasses.asdict(r), indent=None)
    elif not rows:
        click.echo("no executions")
    else:
        table = [
            [r.id, r.workflow, "CORRUPT" if r.corrupt else r.status, r.steps, ts(r.created_at), ts(r.updated_at)]
            + ([_json(r.search or {})] if search else [])
            for r in rows
        ]
        headers = ["ID", "WORKFLOW", "STATUS", "STEPS", "CREATED", "UPDATED"] + (["SEARCH"] if search else [])
        print_table(headers, table, right=[3])
        for r in rows:
            if r.corrupt:
                click.echo(f"  {_cell(r.id)}: unreadable exec document: {r.corrupt}")
    if cursor is not None:
        click.echo(f"more executions: add --cursor {cursor}", err=as_json)


@durable.command()
@click.argument("execution_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx: click.Context, execution_id: str, as_json: bool) -> None:
    """Status, payload, result or error, and the step history as a timeline."""
    info = _describe(_durable(ctx), execution_id)
    s = info.summary
    if as_json:
        data = (
            dataclasses.asdict(s)
            | {
                "payload": info.payload,
                "result": info.result,
                "error": info.error,
                "steps": [dataclasses.asdict(step) for step in info.steps],
                "signals": [dataclasses.asdict(sig) for sig in info.signals],
                "children": list(info.children),
                "corrupt": list(info.corrupt),
                "custom_status": info.custom_status,
            }
            | cli_ops.json_fields(info)
        )
        json_out.echo(data)
        return
    click.echo(f"execution  {_cell(s.id)}")
    click.echo(f"workflow   {_cell(s.workflow)}")
    paused = f"  (paused since {ts(s.paused_at)})" if s.paused_at is not None else ""
    click.echo(f"status     {_cell(s.status)}{'  (cancel requested)' if s.cancel_requested else ''}{paused}")
    click.echo(f"created    {ts(s.created_at)}    updated {ts(s.updated_at)}")
    if s.start_at is not None and s.status == Status.SCHEDULED:
        click.echo(f"starts     {ts(s.start_at)}")
    if s.deadline_at is not None:
        click.echo(f"deadline   {ts(s.deadline_at)}")
    if s.parent:
        click.echo(f"parent     {_cell(s.parent)}")
    click.echo(f"payload    {_json(info.payload)}")
    if info.custom_status is not None:
        click.echo(f"custom     {_json(info.custom_status)}")
    if s.search:
        click.echo(f"search     {_json(s.search)}")
    if s.memo is not None:
        click.echo(f"memo       {_json(s.memo)}")
    if s.status == Status.COMPLETED:
        click.echo(f"result     {_json(info.result)}")
    if info.error:
        click.echo(f"error      {_cell(info.error.get('type'))}: {_cell(info.error.get('message'))}")
    if s.last_error:
        click.echo(f"last error {_cell(s.last_error)}")
    for problem in info.corrupt:
        click.echo(f"CORRUPT    {_cell(problem)}")
    click.echo("")
    if not info.steps:
        click.echo("no steps yet")
    else:
        rows = [
            [
                step.seq,
                step.kind,
                step.name,
                step.state,
                step.attempts or "-",
                ts(step.scheduled_at),
                ts(step.finished_at),
                step.task_id or step.child_id or "-",
            ]  # fmt: skip
            for step in info.steps
        ]
        print_table(["#", "KIND", "NAME", "STATE", "ATTEMPTS", "SCHEDULED", "FINISHED", "TASK ID"], rows, right=[0, 4])
        for step in info.steps:
            if step.input is not None:  # the whole of it in --json
                text = json.dumps(step.input, default=str)
                text = text if len(text) <= 500 else text[:500] + "... (truncated)"
                click.echo(f"  step {step.seq} input: {_cell(text)}")
            if step.heartbeat_at is not None:  # the latest activity.heartbeat(details)
                beat = _cell(json.dumps(step.heartbeat, default=str))
                click.echo(
                    f"  step {step.seq} heartbeat {ts(step.heartbeat_at)} (attempt {step.heartbeat_attempt}): {beat}"
                )
            if step.error or step.corrupt:
                click.echo(f"  step {step.seq}: {_cell(step.corrupt or step.error)}")
            for line in (step.traceback or "").rstrip().splitlines():  # the lines that raised
                click.echo(f"    {_cell(line)}")
    for sig in info.signals:
        click.echo(f"signal {_cell(repr(sig.name))}: {sig.state} at {ts(sig.at)}: {_json(sig.value)}")
    for line in cli_ops.lines(info):  # operator actions, and the steps they forgot (superseded)
        click.echo(line)


@durable.command()
@click.argument("execution_id")
@click.option("--step", type=int, required=True, help="the first step to run again")
@click.option("--reason", default=None, help="recorded with the reset")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@_JSON
@click.pass_context
def reset(ctx: click.Context, execution_id: str, step: int, reason: str | None, yes: bool, as_json: bool) -> None:
    """Re-run a failed, cancelled or timed out execution from step STEP (earlier steps keep their outcomes)."""
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    info = _describe(d, execution_id)
    if not yes:
        head = f"{execution_id} is {info.summary.status}: forget its steps from {step} on and run them again?"
        click.confirm(prompt(d.admin, execution_id, "reset", head, step), abort=True)
    try:
        steps = d.admin.reset(execution_id, step, by=actor(), reason=reason)
    except OperationRefused as exc:
        raise click.ClickException(str(exc)) from exc
    _done({"id": execution_id, "action": "reset", "step": step, "status_before": info.summary.status}, steps, as_json)
    if not as_json:
        click.echo(f"reset to step {step}")


def _json(value: Any) -> str:
    return _cell(json.dumps(value, default=str))


@durable.command()
@click.argument("execution_id")
@click.argument("name")
@click.argument("value")
@_JSON
@click.pass_context
def signal(ctx: click.Context, execution_id: str, name: str, value: str, as_json: bool) -> None:
    """Send signal NAME with a JSON VALUE."""
    d = _durable(ctx)
    _describe(d, execution_id)
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"VALUE is not valid JSON: {exc}") from exc
    try:
        # the path of WorkflowHandle.signal (a name the workflow does not declare is refused
        # there); who sent it is recorded in the same batch as the value
        delivered = d.engine.signal(execution_id, name, data, by=actor())
    except PayloadValidationError as exc:
        raise click.ClickException(str(exc)) from exc
    if not delivered:  # a script must see it: exit status 1, as `durable signal` refusing it
        raise click.ClickException(f"not delivered: execution {execution_id!r} has ended")
    if as_json:
        json_out.echo({"id": execution_id, "action": "signal", "name": name, "delivered": True})
    else:
        click.echo("delivered")
    try:
        ex = d.engine.store.read(execution_id, "exec")
    except DurableError:
        ex = None  # the value and its sender are recorded; only this hint is lost
    if ex is not None and declared_signals(ex, d.registry.workflow(str(ex.get("workflow")))) is None:
        # any name is accepted (typed where the workflow waits): a typo would wait forever
        click.echo(
            f"note: workflow {_cell(ex.get('workflow'))} declares no signals, so any name is accepted: "
            f"the value waits for a wait_signal({_cell(repr(name))})",
            err=True,
        )


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--reason", default=None, help="recorded with the action")
@_JSON
@click.pass_context
def cancel(ctx: click.Context, execution_id: str, yes: bool, reason: str | None, as_json: bool) -> None:
    """Request cancellation (compensations run)."""
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    status = _describe(d, execution_id).summary.status
    if not yes:
        click.confirm(f"cancel {execution_id}?", abort=True)
    requested = d.engine.cancel(execution_id, by=actor(), reason=reason)
    if as_json:
        json_out.echo({"id": execution_id, "action": "cancel", "requested": requested, "status_before": status})
    else:
        click.echo("cancel requested" if requested else "already finished")


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--reason", default=None, help="recorded with the action (and in its error)")
@_JSON
@click.pass_context
def terminate(ctx: click.Context, execution_id: str, yes: bool, reason: str | None, as_json: bool) -> None:
    """End a running execution now, as failed: no compensations, nothing more runs (its running
    children are terminated too). `cancel` is the graceful way."""
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    status = _describe(d, execution_id).summary.status
    if not yes:
        click.confirm(f"terminate {execution_id} now? No compensation runs.", abort=True)
    ended = d.terminate(execution_id, by=actor(), reason=reason)
    if as_json:
        json_out.echo({"id": execution_id, "action": "terminate", "terminated": ended, "status_before": status})
    else:
        click.echo("terminated" if ended else "already finished")


def _done(what: dict[str, Any], steps: list[StepRecord], as_json: bool) -> None:
    """What an operation did: the steps that will run again (``--json``: one object)."""
    if as_json:
        json_out.echo(what | {"rerun": [{"seq": s.seq, "kind": s.kind, "name": s.name} for s in steps]})
        return
    for step in steps:
        click.echo(f"step {step.seq} ({step.name}) will run again")


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation (failed, cancelled or timed out executions)")
@click.option("--reason", default=None, help="recorded with the action")
@_JSON
@click.pass_context
def resume(ctx: click.Context, execution_id: str, yes: bool, reason: str | None, as_json: bool) -> None:
    """Drive a running execution now (after a deploy that registers its workflow, say), or reopen
    a failed one on its recorded history, or withdraw the cancellation of a cancelled (or timed out) one."""
    d = _durable(ctx)
    status = _describe(d, execution_id).summary.status
    if status == Status.COMPLETED:
        raise click.ClickException(f"{execution_id} is completed; nothing to resume")
    if status != Status.RUNNING:
        json_out.needs_yes(as_json, yes)
    if status != Status.RUNNING and not yes:
        cancelled = status in (Status.CANCELLED, Status.TIMED_OUT)  # a timeout is a cancel (its deadline lifted)
        what = "forget its cancellation and compensations" if cancelled else "reopen it"
        click.confirm(prompt(d.admin, execution_id, "resume", f"{execution_id} is {status}: {what}?"), abort=True)
    steps = d.resume(execution_id, by=actor(), reason=reason)
    _done({"id": execution_id, "action": "resume", "status_before": status}, steps, as_json)
    if not as_json:
        click.echo("drive sent" if status == Status.RUNNING else "resumed")


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--reason", default=None, help="recorded with the action")
@_JSON
@click.pass_context
def retry(ctx: click.Context, execution_id: str, yes: bool, reason: str | None, as_json: bool) -> None:
    """Restart a failed execution from its failed step (the step runs again)."""
    json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    status = _describe(d, execution_id).summary.status
    if status != Status.FAILED:
        raise click.ClickException(f"{execution_id} is {status}, not failed")
    if not yes:
        click.confirm(prompt(d.admin, execution_id, "retry", f"retry {execution_id} from its failed step?"), abort=True)
    steps = d.retry(execution_id, by=actor(), reason=reason)
    _done({"id": execution_id, "action": "retry", "status_before": status}, steps, as_json)
    if not as_json:
        click.echo("retrying")


@durable.command()
@click.option("--older-than", required=True, callback=_age_option, help="finished before this age ago (e.g. 30d)")
@click.option("--dry-run", is_flag=True, help="only list what would be deleted")
@click.option("--reason", default=None, help="recorded with each purge")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@_JSON
@click.pass_context
def purge(ctx: click.Context, older_than: float, dry_run: bool, reason: str | None, yes: bool, as_json: bool) -> None:
    """Delete finished executions (all their documents) that ended more than an age ago."""
    if not dry_run:
        json_out.needs_yes(as_json, yes)
    d = _durable(ctx)
    found: list[ExecutionSummary] = []
    plan = d.purge(older_than, dry_run=True, matched=found.append)
    if dry_run:
        _would_purge(plan, found, as_json)
        return
    if not plan.matched:
        if as_json:
            json_out.echo(_purged(plan))
        else:
            click.echo("nothing to purge")
        return
    if not yes:
        click.confirm(f"delete {plan.matched} finished execution(s)?", abort=True)
    # each execution's documents go in all-or-nothing batches of its own partition (engine.admin)
    with cli_render.progress("purging", plan.matched, quiet=as_json) as update:

        def advance(report: PurgeReport) -> None:
            update(report.purged + report.skipped)

        report = d.purge(older_than, progress=advance, by=actor(), reason=reason)
    if as_json:
        json_out.echo(_purged(report))
        return
    click.echo(f"purged {report.purged} ({report.documents} documents)")
    if report.skipped:
        click.echo(f"kept {report.skipped} (the next purge looks again):")
        for why in report.kept:
            click.echo(f"  {_cell(why)}")


def _purged(report: PurgeReport) -> dict[str, Any]:
    return {"action": "purge", "purged": report.purged, "documents": report.documents,
            "kept": report.skipped, "kept_why": list(report.kept)}  # fmt: skip


def _would_purge(plan: PurgeReport, found: list[ExecutionSummary], as_json: bool) -> None:
    """``purge --dry-run``: each execution a purge would delete now (and those it would keep)."""
    rows = [{"id": s.id, "workflow": s.workflow, "status": s.status,
             "ended_at": s.completed_at or s.updated_at or s.created_at} for s in found]  # fmt: skip
    if as_json:
        json_out.echo({"action": "purge", "dry_run": True, "would_purge": rows, "kept_why": list(plan.kept)})
        return
    if not rows and not plan.kept:
        click.echo("nothing to purge")
        return
    click.echo(f"would purge {len(rows)}")
    if rows:
        print_table(
            ["ID", "WORKFLOW", "STATUS", "ENDED"],
            [[r["id"], r["workflow"], r["status"], ts(r["ended_at"])] for r in rows],
        )
    if plan.kept:
        click.echo(f"would keep {len(plan.kept)}:")
    for why in plan.kept:
        click.echo(f"  {_cell(why)}")


@durable.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="address to bind (not loopback: pages need the token)"
)
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True)
@click.option("--token", envvar="DURABLE_UI_TOKEN", default=None, help="token for actions (default: random, printed)")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME", help="a Host name to answer (repeatable)")
@click.option("--public-read", is_flag=True, help="on a non-loopback bind, let anyone who reaches it read pages")
@click.pass_context
def ui(
    ctx: click.Context, host: str, port: int, token: str | None, allow_hosts: tuple[str, ...], public_read: bool
) -> None:
    """Serve the web timeline: executions, step timelines, outbox lanes and actions (the [ui] extra)."""
    try:
        from celery_durable.ui import serve
    except ImportError as exc:
        raise click.ClickException(f"the web UI needs the ui extra: pip install 'celery-durable[ui]' ({exc})") from exc
    try:
        serve(_durable(ctx), host=host, port=port, token=token, allow_hosts=allow_hosts, public_read=public_read)
    except ValueError as exc:  # a token too short
        raise click.UsageError(str(exc)) from exc


from celery_durable.cli.batch_commands import batch as _batch  # noqa: E402 - `durable batch ACTION …`
from celery_durable.cli.cosmos import cosmos as _cosmos  # noqa: E402 - the `durable cosmos …` subgroup
from celery_durable.cli.limit_commands import limit as _limit  # noqa: E402 - `durable limit …`
from celery_durable.cli.outbox_commands import outbox as _outbox  # noqa: E402 - `durable outbox …`
from celery_durable.cli.pause_commands import pause as _pause  # noqa: E402 - `durable pause ID`
from celery_durable.cli.pause_commands import unpause as _unpause  # noqa: E402 - `durable unpause ID`
from celery_durable.cli.replay_commands import export as _export  # noqa: E402 - `durable export ID`
from celery_durable.cli.replay_commands import replay_check as _replay_check  # noqa: E402 - `durable replay-check`
from celery_durable.cli.schedule_commands import schedule as _schedule  # noqa: E402 - `durable schedule …`
from celery_durable.cli.update_commands import update as _update  # noqa: E402 - `durable update ID NAME`

durable.add_command(_cosmos)
durable.add_command(_outbox)
durable.add_command(_limit)
durable.add_command(_schedule)
durable.add_command(_export)
durable.add_command(_pause)
durable.add_command(_batch)
durable.add_command(_unpause)
durable.add_command(_replay_check)
durable.add_command(_update)
