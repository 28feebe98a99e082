"""``celery -A proj durable limit show NAME [--key KEY]``: who holds a limit's slots and who waits, in order."""

from __future__ import annotations

from typing import Any

import click

from celery_durable.cli import json_out
from celery_durable.cli.context import durable_of
from celery_durable.cli.render import print_table
from celery_durable.engine.admin.wording import ts
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import limit_pk
from celery_durable.engine.limits.table import queue_order, room
from celery_durable.engine.limits.workflows import is_execution

__all__ = ["limit"]


@click.group()
def limit() -> None:
    """Keyed concurrency and rate limits (``Limit``): slots held and steps waiting."""


def describe(doc: dict[str, Any], now: float) -> dict[str, Any]:
    """A limit document as an operator reads it: its declaration, holders and queue (in grant order)."""
    holders = [
        {"execution_id": _eid(s), "seq": _seq(s), "kind": _kind(s), "attempt": h.get("n"),
         "since": h.get("at"), "expires": h.get("exp"), "group": h.get("g")}
        for s, h in sorted((doc.get("holders") or {}).items(), key=lambda kv: float(kv[1].get("at") or 0.0))
    ]  # fmt: skip
    waiting = [
        {"execution_id": w.get("e"), "seq": _seq(str(w.get("s"))), "kind": _kind(str(w.get("s"))),
         "priority": w.get("p"), "group": w.get("g"), "since": w.get("at")}
        for w in queue_order(doc)
    ]  # fmt: skip
    return {"limit": doc.get("name"), "key": doc.get("key"), "max_running": doc.get("max"), "rate": doc.get("rate"),
            "room": room(doc, now), "holders": holders, "waiting": waiting}  # fmt: skip


def _kind(step: str) -> str:
    """What holds or waits: a workflow execution (``@durable.workflow(limit=)``) or an activity step."""
    return "workflow" if is_execution(step) else "activity"


def _eid(step: str) -> str:
    return step.removesuffix("|wf") if is_execution(step) else step.rsplit("|", 2)[0]


def _seq(step: str) -> int | None:
    return None if is_execution(step) else int(step.rsplit("|", 2)[2])


def _step(entry: dict[str, Any]) -> str:
    return "workflow" if entry["seq"] is None else str(entry["seq"])


@limit.command(name="show")
@click.argument("name")
@click.option("--key", default="", help="the key (what the limit's key= gives); none for a limit without one")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def limit_show(ctx: click.Context, name: str, key: str, as_json: bool) -> None:
    """The slots of limit NAME for one key: who holds them, who waits (next first)."""
    d = durable_of(ctx)
    doc = d.engine.store.read(limit_pk({"name": name, "key": key}), LIMIT_DOC_ID)
    if doc is None:
        raise click.ClickException(f"limit {name!r} has no document for key {key!r}: no step has used it")
    view = describe(doc, d.engine.clock.now())
    if as_json:
        json_out.echo(view)
        return
    rate = view["rate"]
    click.echo(f"limit {name!r} key {key!r}: max_running {view['max_running']}, "
               f"rate {f'{rate[0]}/{rate[1]:g}s' if rate else 'none'}, room now {view['room']}")  # fmt: skip
    if view["holders"]:
        print_table(["HOLDER", "STEP", "ATTEMPT", "SINCE", "SLOT EXPIRES", "GROUP"],
                    [[h["execution_id"], _step(h), str(h["attempt"]), ts(h["since"]), ts(h["expires"]),
                      str(h["group"])] for h in view["holders"]])  # fmt: skip
    else:
        click.echo("no slot held")
    if view["waiting"]:
        print_table(["WAITING (next first)", "STEP", "PRIORITY", "GROUP", "SINCE"],
                    [[w["execution_id"], _step(w), str(w["priority"]), str(w["group"]), ts(w["since"])]
                     for w in view["waiting"]])  # fmt: skip
    else:
        click.echo("nothing waits")
