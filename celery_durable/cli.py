"""``celery -A proj durable …``: list, show, signal, cancel, resume, retry and purge executions.

Registered through the ``celery.commands`` entry point, so it runs with the app, config and
store of the project, like ``celery inspect``. Tables by default, ``--json`` for scripts;
destructive commands ask for confirmation unless ``--yes``.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import click

from .app import Durable
from .engine.dispatcher import ActivityRequest
from .engine.model import EXEC_ID, FAILED, RUNNING, TERMINAL
from .errors import DurableError, PayloadValidationError, UnknownWorkflowError

__all__ = ["durable"]

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` → seconds."""
    m = _AGE.match(text.strip())
    if not m:
        raise click.BadParameter(f"{text!r} is not an age like 30s, 15m, 2h, 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _ts(value: Any) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(float(value), tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) for r in rows]
    return "\n".join(out)


def _durable(ctx: click.Context) -> Durable:
    app = ctx.obj.app if ctx.obj is not None and hasattr(ctx.obj, "app") else None
    if app is None:
        raise click.ClickException("no Celery app: run it as `celery -A proj durable …`")
    try:
        return Durable.of(app)
    except DurableError as exc:
        raise click.ClickException(str(exc)) from exc


def _exec_or_fail(d: Durable, execution_id: str) -> dict[str, Any]:
    try:
        return d.engine.read_exec(execution_id)
    except UnknownWorkflowError as exc:
        raise click.ClickException(f"unknown execution id {execution_id!r}") from exc


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": doc["pk"],
        "workflow": doc.get("workflow"),
        "status": doc.get("status"),
        "steps": doc.get("steps", 0),
        "created_at": doc.get("created_at"),
        "updated_at": doc.get("updated_at"),
        "cancel_requested": bool(doc.get("cancel_requested")),
        "last_error": doc.get("last_error"),
    }


@click.group(name="durable")
@click.pass_context
def durable(ctx: click.Context) -> None:
    """Inspect and operate durable workflow executions."""


@durable.command(name="list")
@click.option("--status", type=click.Choice(["running", "completed", "failed", "cancelled"]), default=None)
@click.option("--workflow", default=None, help="only executions of this workflow name")
@click.option("--older-than", default=None, help="created before this age ago (e.g. 2h)")
@click.option("--newer-than", default=None, help="created within this age (e.g. 15m)")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON lines for scripts")
@click.pass_context
def list_(
    ctx: click.Context,
    status: str | None,
    workflow: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List executions, newest first."""
    d = _durable(ctx)
    now = time.time()
    rows = []
    for pk in d.store.scan_partitions("", limit=100_000):
        doc = d.store.read(pk, EXEC_ID)
        if doc is None:
            continue
        created = float(doc.get("created_at") or 0)
        if status and doc.get("status") != status:
            continue
        if workflow and doc.get("workflow") != workflow:
            continue
        if older_than and created > now - parse_age(older_than):
            continue
        if newer_than and created < now - parse_age(newer_than):
            continue
        rows.append(_summary(doc))
    rows.sort(key=lambda r: r["created_at"] or 0, reverse=True)
    rows = rows[:limit]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
        return
    if not rows:
        click.echo("no executions")
        return
    table = [
        [r["id"], str(r["workflow"]), str(r["status"]), str(r["steps"]), _ts(r["created_at"]), _ts(r["updated_at"])]
        for r in rows
    ]
    click.echo(_table(table, ["ID", "WORKFLOW", "STATUS", "STEPS", "CREATED", "UPDATED"]))


def _timeline(docs: list[dict[str, Any]], run: int) -> list[dict[str, Any]]:
    by_id = {d["id"]: d for d in docs}
    steps: list[dict[str, Any]] = []
    for d in docs:
        if d.get("type") != "step" or int(d.get("run") or 0) != run:
            continue
        seq = int(d["seq"])
        rid = f"r{run or ''}:{seq:06d}"
        outcome = by_id.get(f"sig{run or ''}:{d['name']}") if d.get("kind") == "signal" else by_id.get(rid)
        if outcome is None:
            state = "waiting" if d.get("kind") in ("sleep", "signal") else ("running" if d.get("lease") else "pending")
            if d.get("kind") in ("now", "uuid", "seed", "random"):
                state = "recorded"
        elif outcome.get("cancelled"):
            state = "cancelled"
        elif outcome.get("timeout"):
            state = "timed out"
        else:
            state = "ok" if outcome.get("ok", True) else "failed"
        err = (outcome or {}).get("error") or {}
        steps.append(
            {
                "seq": seq,
                "kind": d.get("kind"),
                "name": d.get("name"),
                "state": state,
                "attempts": (outcome or {}).get("attempts", d.get("attempts")),
                "task_id": d.get("task_id"),
                "child_id": d.get("child_id"),
                "scheduled_at": d.get("created_at"),
                "finished_at": (outcome or {}).get("completed_at")
                or (outcome or {}).get("fired_at")
                or (outcome or {}).get("sent_at"),
                "error": f"{err.get('type')}: {err.get('message')}" if err else None,
            }
        )
    steps.sort(key=lambda s: int(s["seq"] or 0))
    return steps


@durable.command()
@click.argument("execution_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx: click.Context, execution_id: str, as_json: bool) -> None:
    """Status, payload, result or error, and the step history as a timeline."""
    d = _durable(ctx)
    ex = _exec_or_fail(d, execution_id)
    docs = d.store.query_partition(execution_id).docs
    steps = _timeline(docs, int(ex.get("run") or 0))
    info = _summary(ex) | {
        "payload": ex.get("payload"),
        "result": ex.get("result"),
        "error": ex.get("error"),
        "run": ex.get("run", 0),
        "parent": ex.get("parent"),
        "steps": steps,
    }
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    click.echo(f"execution  {execution_id}")
    click.echo(f"workflow   {ex.get('workflow')}")
    click.echo(f"status     {ex.get('status')}{'  (cancel requested)' if ex.get('cancel_requested') else ''}")
    click.echo(f"created    {_ts(ex.get('created_at'))}    updated {_ts(ex.get('updated_at'))}")
    click.echo(f"payload    {json.dumps(ex.get('payload'))}")
    if ex.get("status") == "completed":
        click.echo(f"result     {json.dumps(ex.get('result'))}")
    if ex.get("error"):
        err = ex["error"]
        click.echo(f"error      {err.get('type')}: {err.get('message')}")
    if ex.get("last_error"):
        click.echo(f"last error {ex['last_error']}")
    click.echo("")
    if not steps:
        click.echo("no steps yet")
        return
    rows = [
        [
            str(s["seq"]),
            str(s["kind"]),
            str(s["name"]),
            s["state"],
            str(s["attempts"] or "-"),
            _ts(s["scheduled_at"]),
            _ts(s["finished_at"]),
            s["task_id"] or s["child_id"] or "-",
        ]
        for s in steps
    ]
    click.echo(_table(rows, ["#", "KIND", "NAME", "STATE", "ATTEMPTS", "SCHEDULED", "FINISHED", "TASK ID"]))
    for s in steps:
        if s["error"]:
            click.echo(f"  step {s['seq']}: {s['error']}")


@durable.command()
@click.argument("execution_id")
@click.argument("name")
@click.argument("value")
@click.pass_context
def signal(ctx: click.Context, execution_id: str, name: str, value: str) -> None:
    """Send signal NAME with a JSON VALUE."""
    d = _durable(ctx)
    _exec_or_fail(d, execution_id)
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"VALUE is not valid JSON: {exc}") from exc
    try:
        delivered = d.engine.signal(execution_id, name, data)
    except PayloadValidationError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("delivered" if delivered else "ignored: a value was already recorded or the execution ended")


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_context
def cancel(ctx: click.Context, execution_id: str, yes: bool) -> None:
    """Request cancellation (compensations run)."""
    d = _durable(ctx)
    _exec_or_fail(d, execution_id)
    if not yes:
        click.confirm(f"cancel {execution_id}?", abort=True)
    click.echo("cancel requested" if d.engine.cancel(execution_id) else "already finished")


@durable.command()
@click.argument("execution_id")
@click.pass_context
def resume(ctx: click.Context, execution_id: str) -> None:
    """Drive a running execution now (after a deploy that registers its workflow, say)."""
    d = _durable(ctx)
    ex = _exec_or_fail(d, execution_id)
    if ex.get("status") != RUNNING:
        raise click.ClickException(f"{execution_id} is {ex.get('status')}; `retry` restarts a failed one")
    d.engine.links.wake(execution_id)
    click.echo("drive sent")


@durable.command()
@click.argument("execution_id")
@click.option("--yes", is_flag=True)
@click.pass_context
def retry(ctx: click.Context, execution_id: str, yes: bool) -> None:
    """Restart a failed execution from its failed step (the step runs again)."""
    d = _durable(ctx)
    ex = _exec_or_fail(d, execution_id)
    if ex.get("status") != FAILED:
        raise click.ClickException(f"{execution_id} is {ex.get('status')}, not failed")
    if not yes:
        click.confirm(f"retry {execution_id} from its failed step?", abort=True)
    store = d.store
    run = int(ex.get("run") or 0)
    docs = {doc["id"]: doc for doc in store.query_partition(execution_id).docs}
    failed = sorted(
        (
            doc
            for doc in docs.values()
            if doc.get("type") == "result"
            and int(doc.get("run") or 0) == run
            and doc.get("ok") is False
            and not doc.get("cancelled")
        ),
        key=lambda doc: int(doc["seq"]),
    )
    resend: ActivityRequest | None = None
    if failed:
        step = failed[-1]
        seq = int(step["seq"])
        store.delete(execution_id, step["id"])
        marker = docs.get(f"s{run or ''}:{seq:06d}")
        if marker is not None and marker.get("kind") == "activity":
            payload = marker.get("input") or {}
            resend = ActivityRequest(
                execution_id,
                seq,
                str(marker["name"]),
                list(payload.get("args", [])),
                dict(payload.get("kwargs", {})),
                str(marker.get("task_id")),
                str(ex.get("workflow")),
                run=run,
            )
            updated = {k: v for k, v in marker.items() if k != "_etag"} | {"attempts": 0, "lease": None}
            store.replace(updated, if_match=marker["_etag"])
        click.echo(f"step {seq} ({step.get('name')}) will run again")
    fresh = store.read(execution_id, EXEC_ID)
    assert fresh is not None
    reopened = {k: v for k, v in fresh.items() if k != "_etag"} | {
        "status": RUNNING,
        "error": None,
        "completed_at": None,
        "retried": int(fresh.get("retried") or 0) + 1,
    }
    store.replace(reopened, if_match=fresh["_etag"])
    d.engine.cache.invalidate(execution_id)
    if resend is not None:
        d.engine.dispatch(resend)
    d.engine.links.wake(execution_id)
    click.echo("retrying")


@durable.command()
@click.option("--older-than", required=True, help="finished before this age ago (e.g. 30d)")
@click.option("--yes", is_flag=True)
@click.pass_context
def purge(ctx: click.Context, older_than: str, yes: bool) -> None:
    """Delete finished executions (all their documents) older than an age."""
    d = _durable(ctx)
    cutoff = time.time() - parse_age(older_than)
    victims = []
    for pk in d.store.scan_partitions("", limit=100_000):
        doc = d.store.read(pk, EXEC_ID)
        if (
            doc
            and doc.get("status") in TERMINAL
            and float(doc.get("completed_at") or doc.get("updated_at") or 0) < cutoff
        ):
            victims.append(pk)
    if not victims:
        click.echo("nothing to purge")
        return
    if not yes:
        click.confirm(f"delete {len(victims)} finished execution(s)?", abort=True)
    for pk in victims:
        for doc in d.store.query_partition(pk).docs:
            d.store.delete(pk, doc["id"])
    click.echo(f"purged {len(victims)}")


@durable.group()
def outbox() -> None:
    """Effect outbox rows: list, show, cancel, retry."""


def _effect_row(info: Any) -> list[str]:
    return [info.id, info.type, info.key, info.status, f"{info.attempt}/{info.max_attempts}",
            _ts(info.created_at), _ts(info.completed_at), (info.last_error or info.reason or "")[:60]]  # fmt: skip


_EFFECT_HEADERS = ["EFFECT ID", "TYPE", "KEY", "STATUS", "ATTEMPT", "CREATED", "SETTLED", "LAST ERROR"]


@outbox.command(name="list")
@click.option("--key", required=True, help="the ordering lane to list")
@click.option("--status", default=None, type=click.Choice(["pending", "running", "succeeded", "failed", "cancelled"]))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def outbox_list(ctx: click.Context, key: str, status: str | None, as_json: bool) -> None:
    """Rows of one key, in order (live, settled within retention, failed)."""
    d = _durable(ctx.find_root())
    rows = [r for r in d.outbox.rows(key) if status is None or r.status == status]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r.__dict__, default=str))
        return
    click.echo(_table([_effect_row(r) for r in rows], _EFFECT_HEADERS) if rows else "no effects")


@outbox.command(name="show")
@click.argument("effect_id")
@click.pass_context
def outbox_show(ctx: click.Context, effect_id: str) -> None:
    """One effect row, with its payload and last error."""
    d = _durable(ctx.find_root())
    info = d.outbox.get(effect_id)
    if info is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    click.echo(json.dumps(info.__dict__, indent=2, default=str))


@outbox.command(name="cancel")
@click.argument("effect_id", required=False)
@click.option("--key", default=None, help="cancel the pending/running rows of this key")
@click.option("--type", "types", multiple=True, help="with --key: only these effect types")
@click.option("--yes", is_flag=True)
@click.pass_context
def outbox_cancel(
    ctx: click.Context, effect_id: str | None, key: str | None, types: tuple[str, ...], yes: bool
) -> None:
    """Cancel one effect by id, or a key's pending and running effects."""
    if (effect_id is None) == (key is None):
        raise click.UsageError("give an EFFECT_ID or --key, not both")
    d = _durable(ctx.find_root())
    if effect_id is not None and d.outbox.get(effect_id) is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    if not yes:
        click.confirm(f"cancel {effect_id or 'the live effects of key ' + str(key)}?", abort=True)
    n = d.outbox.cancel(effect_id, key=key, types=list(types) or None)
    click.echo(f"cancelled {n}")


@outbox.command(name="retry")
@click.argument("effect_id")
@click.option("--yes", is_flag=True)
@click.pass_context
def outbox_retry(ctx: click.Context, effect_id: str, yes: bool) -> None:
    """Run a failed effect again: a new row (id ``<id>:retry<n>``) with the same type, key and
    payload. The failed row is kept as it is, for the record."""
    d = _durable(ctx.find_root())
    info = d.outbox.get(effect_id)
    if info is None:
        raise click.ClickException(f"unknown effect id {effect_id!r}")
    if info.status != "failed":
        raise click.ClickException(f"effect {effect_id} is {info.status}, not failed")
    if not yes:
        click.confirm(f"run {info.type} {effect_id} again?", abort=True)
    n = 1
    while d.outbox.get(f"{effect_id}:retry{n}") is not None:
        n += 1
    new_id = f"{effect_id}:retry{n}"
    d.outbox.enqueue(info.type, info.payload, key=info.key, effect_id=new_id)
    click.echo(f"enqueued {new_id}")
