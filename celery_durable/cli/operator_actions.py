"""What ``durable show`` prints of operator actions and the steps they forgot, and what the
prompts of ``retry``/``resume``/``reset`` say they will forget (engine/admin/oplog.py records them)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from celery_durable.engine.admin.operator import ExecutionDetail
from celery_durable.engine.admin.superseded import SupersededStep
from celery_durable.engine.admin.wording import escape, ts

__all__ = ["json_fields", "lines"]


def _cell(value: Any) -> str:
    return escape("-" if value is None else str(value))


def _value(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str)
    return _cell(text if len(text) <= limit else text[: limit - 1] + "…")


def _superseded(s: SupersededStep) -> str:
    shown = s.error if s.error else _value(s.value) if s.value is not None else ""
    cut = " (value truncated)" if s.value_truncated else ""
    return f"  superseded step {s.seq} {_cell(s.name)} ({s.kind}, {s.state}) {_cell(shown)}{cut}"


def lines(info: ExecutionDetail) -> list[str]:
    """One line an operation (who, when, why, what it forgot), then the steps it superseded."""
    out: list[str] = []
    for op in info.operations:
        step = f" to step {op.get('step')}" if op.get("step") is not None else ""
        what = f" signal {_cell(repr(op.get('name')))}" if op.get("name") is not None else ""
        why = f" (reason: {_cell(op.get('reason'))})" if op.get("reason") else ""
        forgot = op.get("forgotten")
        n = len(forgot) if isinstance(forgot, list) else forgot if isinstance(forgot, int) else 0
        more = op.get("forgotten_more") or 0
        tail = f"; forgot {n + more} step(s)" if n or more else ""
        out.append(f"{_cell(op.get('action'))}{step}{what} by {_cell(op.get('by'))} at {ts(op.get('at'))}{why}{tail}")
        mine = [s for s in info.superseded if s.op == op.get("id")]
        out += [_superseded(s) for s in mine if s.execution is None]
        if more:
            out.append(f"  ... and {more} more superseded step(s) not archived")
        for child in op.get("forgotten_children") or ():
            cid = child.get("id") if isinstance(child, dict) else child
            status = child.get("status") if isinstance(child, dict) else None
            out.append(f"  forgotten child execution {_cell(cid)} ({_cell(status)}, deleted), its steps:")
            for o in (child.get("operations") or ()) if isinstance(child, dict) else ():
                why = f" (reason: {_cell(o.get('reason'))})" if isinstance(o, dict) and o.get("reason") else ""
                if isinstance(o, dict):  # who acted on the child (deleted with it): kept here
                    out.append(f"    {_cell(o.get('action'))} by {_cell(o.get('by'))} at {ts(o.get('at'))}{why}")
            out += ["  " + _superseded(s) for s in mine if s.execution == cid]
            if isinstance(child, dict) and child.get("forgotten_more"):
                out.append(f"    ... and {child['forgotten_more']} more not archived")
    return out


def json_fields(info: ExecutionDetail) -> dict[str, Any]:
    """The ``--json`` fields: the operation documents and the superseded steps."""
    return {
        "operations": [dict(op) for op in info.operations],
        "superseded": [dataclasses.asdict(s) for s in info.superseded],
    }
