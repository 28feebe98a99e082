"""What the pages show, computed from the engine's read model (no HTML here).

:func:`chart` lays out the step timeline of an :class:`ExecutionDetail` as rows of bars on a
time axis (the template draws them as inline SVG); :func:`lanes_of` finds the outbox lanes an
execution emitted to; :func:`detail_json` is the JSON the page polls.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from pydantic import TypeAdapter

from celery_durable.engine.admin.operator import ExecutionDetail, StepRecord
from celery_durable.engine.admin.wording import parse_age, prompt, ts
from celery_durable.engine.core import Engine
from celery_durable.engine.documents.records import seq_of
from celery_durable.engine.documents.schema import TERMINAL, StepKind, marker_id
from celery_durable.errors import DurableError, StoreUnavailable
from celery_durable.glue.outbox import EffectInfo

__all__ = [
    "Bar",
    "Mark",
    "Row",
    "Chart",
    "Lane",
    "chart",
    "lanes_of",
    "detail_json",
    "confirms",
    "exec_url",
    "signal_schemas",
    "duration",
    "pretty",
    "parse_age",
]

#: pixels: the label column, the plot, one row
LABEL_W, PLOT_W, ROW_H = 260, 640, 22
#: at most this many lanes are read for one execution page
MAX_LANES = 20


def signal_schemas(wf: Any, names: list[str]) -> dict[str, str]:
    """Each declared signal's value type as JSON Schema text (pydantic's), for the signal form;
    a type pydantic cannot describe is named instead."""
    out: dict[str, str] = {}
    declared = getattr(wf, "signals", None) or {}
    for name in names:
        kind = declared.get(name)
        if kind is None:
            continue
        try:
            out[name] = json.dumps(TypeAdapter(kind).json_schema(), sort_keys=True)
        except Exception:  # noqa: BLE001 - a hint pydantic cannot render: its name says enough
            out[name] = getattr(kind, "__name__", repr(kind))
    return out


def exec_url(execution_id: str) -> str:
    """The page of an execution (any id: ``/``, ``?`` and ``#`` are escaped)."""
    return "/executions/" + quote(execution_id, safe="")


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds // 60:.0f} m {seconds % 60:.0f} s"
    return f"{seconds / 3600:.1f} h"


def pretty(value: Any, limit: int = 20_000) -> str:
    """JSON for a ``<pre>`` (cut past ``limit`` characters: a page is no place for a 10 MB blob)."""
    text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def slug(state: str) -> str:
    """A CSS class part for a state (``timed out`` → ``timed-out``)."""
    return re.sub(r"[^a-z0-9]+", "-", state.lower()).strip("-") or "unknown"


@dataclass(frozen=True)
class Bar:
    x: float
    w: float
    cls: str
    title: str


@dataclass(frozen=True)
class Mark:
    x: float
    cls: str
    title: str


@dataclass(frozen=True)
class Row:
    label: str
    note: str
    href: str | None
    bars: tuple[Bar, ...] = ()
    marks: tuple[Mark, ...] = ()


@dataclass(frozen=True)
class Chart:
    t0: float
    t1: float
    rows: tuple[Row, ...]
    ticks: tuple[tuple[float, str, str], ...]  # x, label, title
    label_w: int = LABEL_W
    plot_w: int = PLOT_W
    row_h: int = ROW_H

    @property
    def width(self) -> int:
        return self.label_w + self.plot_w + 20

    @property
    def height(self) -> int:
        return (len(self.rows) + 1) * self.row_h + 10


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _bounds(detail: ExecutionDetail, now: float) -> tuple[float, float]:
    s = detail.summary
    times = [
        t
        for step in detail.steps
        for t in (step.scheduled_at, step.started_at, step.finished_at, step.failed_at)
        if _finite(t) is not None and t
    ]
    times += [sig.at for sig in detail.signals if sig.at]
    start = _finite(s.created_at) or (min(times) if times else now)
    running = s.status not in TERMINAL
    end_candidates = [*times, start]
    end_candidates.append(now if running else (_finite(s.completed_at) or _finite(s.updated_at) or start))
    end = max(end_candidates)
    end = end if end > start else start + 1.0
    # a deadline ahead (a timer, a wait's timeout, a retry) is drawn when near enough: a
    # 3-day timer must not squeeze the hour that happened into a pixel
    reach = end + max(60.0, 2 * (end - start))
    ahead = [
        t
        for step in detail.steps
        if running and step.finished_at is None
        for t in map(_finite, (step.deadline, step.retry_at))
        if t is not None and end < t <= reach
    ]
    return start, max([end, *ahead])


#: the bar colour of a step that waits, by kind: a timer, a wait for a signal (a person, often)
_WAIT_CLS: dict[str, str] = {StepKind.SLEEP: "timer", StepKind.SIGNAL: "human"}


def _retries(step: StepRecord, label: str, start: float, end: float, x: Any) -> tuple[list[Bar], float]:
    """The attempts before the last and the backoff after the last failed one, and where the
    bar of the attempt after them starts."""
    failed, retry_at = _finite(step.failed_at), _finite(step.retry_at)
    if failed is None or failed < start:
        return [], start
    retry_at = max(failed, retry_at if retry_at is not None else failed)
    began = _finite(step.started_at)
    began = began if began is not None and began > failed else None  # an attempt after the backoff
    finished = _finite(step.finished_at)
    # a local activity's retry records no start on its marker: it ran if the step ended after
    ran_after = began is not None or (finished is not None and finished >= retry_at)
    n = (step.attempts or 1) - (1 if ran_after else 0)
    what = f"{label}: attempts 1-{n} failed" if n > 1 else f"{label}: attempt 1 failed"
    bars = [Bar(x(start), max(1.0, x(failed) - x(start)), "earlier", what)]
    stop = min(retry_at, began if began is not None else end)
    bars.append(Bar(x(failed), max(1.0, x(stop) - x(failed)), "backoff", f"{label}: backoff until {ts(retry_at)}"))
    return bars, stop


def _step_row(step: StepRecord, x: Any, now: float, running: bool) -> Row:
    label = f"#{step.seq} {step.kind} {step.name}"
    href = exec_url(step.child_id) if step.kind == StepKind.CHILD and step.child_id else None
    note = step.state + (f" · {step.attempts} attempts" if (step.attempts or 0) > 1 else "")
    start = _finite(step.scheduled_at)
    if start is None:
        return Row(label, note, href)
    if step.kind == StepKind.EMIT:
        # an emit is recorded when taken (its effect runs in the outbox: see the lanes)
        return Row(label, "emitted", href, (), (Mark(x(start), "emit", f"{label}: emitted {ts(start)}"),))
    began = _finite(step.started_at)
    open_ended = step.finished_at is None and step.state in ("running", "pending", "waiting") and running
    end = _finite(step.finished_at) or (now if open_ended else (began or start))
    took = f"{ts(start)} → {ts(step.finished_at) if step.finished_at else 'now' if open_ended else '-'}"
    title = f"{label}: {step.state}; {took} ({duration(end - start)})"
    if (step.attempts or 0) > 1:
        title += f"; {step.attempts} attempts (retried)"
    if step.error:
        title += f"; {step.error}"
    bars, first = _retries(step, label, start, end, x)
    if began is not None and began > first:
        bars.append(
            Bar(x(first), max(1.0, x(began) - x(first)), "queued", f"{label}: queued {duration(began - first)}")
        )
        first = began
    elif bars and end > first:  # no attempt since the backoff: queued since (or ended so)
        cls = "queued" if open_ended else f"state-{slug(step.state)}"
        bars.append(Bar(x(first), max(1.0, x(end) - x(first)), cls, title))
        first = end
    cls = f"state-{slug(step.state)}"
    if step.state == "waiting":
        cls = _WAIT_CLS.get(step.kind, cls)
    elif step.kind == StepKind.SLEEP and step.state == "ok":
        cls = "timer-fired"
    if end > first or not bars or bars[-1].title != title:  # the step's own bar: its state, always
        bars.append(Bar(x(min(first, end)), max(2.0, x(end) - x(first)), cls, title))
    marks: list[Mark] = []
    if (step.attempts or 0) > 1 and began is not None:
        marks.append(Mark(x(began), "retry", f"attempt {step.attempts} started {ts(began)}"))
    deadline = _finite(step.deadline)
    if deadline is not None:
        what = "fires" if step.kind == StepKind.SLEEP else "times out"
        if open_ended and deadline > end:  # still ahead: drawn dashed up to it (or the edge)
            bars.append(Bar(x(end), max(1.0, x(deadline) - x(end)), "planned", f"{label}: {what} at {ts(deadline)}"))
        marks.append(Mark(x(deadline), "deadline", f"{label}: {what if open_ended else 'deadline'} at {ts(deadline)}"))
    return Row(label, note, href, tuple(bars), tuple(marks))


def chart(detail: ExecutionDetail, now: float) -> Chart:
    """The steps (one row each) and the signals (one row of marks) on one time axis."""
    t0, t1 = _bounds(detail, now)
    scale = PLOT_W / (t1 - t0)

    def x(t: float) -> float:
        return round(LABEL_W + (min(max(t, t0), t1) - t0) * scale, 1)

    running = detail.summary.status not in TERMINAL
    rows = [_step_row(step, x, now, running) for step in detail.steps]
    if detail.signals:
        marks = tuple(
            Mark(
                x(sig.at or t0),
                f"sig-{slug(sig.state)}",
                f"signal {sig.name!r} {sig.state} at {ts(sig.at)}: {pretty(sig.value, 200)}"
                + (f" ({sig.error})" if sig.error else ""),
            )
            for sig in detail.signals
        )
        rows.append(Row("signals", f"{len(detail.signals)} received", None, (), marks))
    ticks = tuple(
        (x(t0 + (t1 - t0) * i / 4), "+" + duration((t1 - t0) * i / 4), ts(t0 + (t1 - t0) * i / 4)) for i in range(5)
    )
    return Chart(t0, t1, tuple(rows), ticks)


@dataclass(frozen=True)
class Lane:
    key: str
    rows: tuple[EffectInfo, ...] = ()
    error: str | None = None
    steps: tuple[int, ...] = field(default=())


def _effect_keys(engine: Engine, detail: ExecutionDetail) -> dict[str, list[int]]:
    """The lane key of each effect the current run emitted (read from the emit markers:
    one batched read of the execution's partition), by key."""
    emits = [s.seq for s in detail.steps if s.kind == StepKind.EMIT]
    keys: dict[str, list[int]] = {}
    if not emits:
        return keys
    run = detail.summary.run
    docs = engine.store.read_many(detail.summary.id, [marker_id(seq, run) for seq in emits[:1000]])
    for doc in docs:
        effect = doc.get("effect") if doc is not None else None
        if doc is not None and isinstance(effect, dict) and isinstance(effect.get("key"), str):
            keys.setdefault(effect["key"], []).append(seq_of(doc))
    return keys


def lanes_of(engine: Engine, detail: ExecutionDetail) -> list[Lane]:
    """The outbox lanes the execution's effects went to, each with its rows (a lane that cannot
    be read says why; it does not hide the page)."""
    try:
        keys = _effect_keys(engine, detail)
    except StoreUnavailable:
        raise  # the page is a 503 (ui/app.py), not a page saying so
    except DurableError as exc:
        return [Lane(detail.summary.id, error=f"the emit steps cannot be read: {exc}")]
    out: list[Lane] = []
    for key, seqs in list(keys.items())[:MAX_LANES]:
        out.append(read_lane(engine, key, tuple(seqs)))
    return out


def read_lane(engine: Engine, key: str, steps: tuple[int, ...] = ()) -> Lane:
    try:
        return Lane(key, tuple(EffectInfo.from_row(r) for r in engine.outbox.rows(key)), None, steps)
    except StoreUnavailable:
        raise
    except (DurableError, KeyError, TypeError, ValueError) as exc:
        return Lane(key, error=f"{type(exc).__name__}: {exc}", steps=steps)


def detail_json(detail: ExecutionDetail) -> dict[str, Any]:
    """The read model as JSON (what ``durable show --json`` prints, plus the summary fields)."""
    data = dataclasses.asdict(detail.summary) | {
        "payload": detail.payload,
        "result": detail.result,
        "error": detail.error,
        "steps": [dataclasses.asdict(s) for s in detail.steps],
        "signals": [dataclasses.asdict(s) for s in detail.signals],
        "children": list(detail.children),
        "corrupt": list(detail.corrupt),
        "custom_status": getattr(detail, "custom_status", None),
        "operations": [dict(op) for op in detail.operations],
        "superseded": [dataclasses.asdict(s) for s in detail.superseded],
    }
    return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]


#: the confirmations of the actions that forget nothing (cancel's is fixed in the template)
_HEADS = {
    "retry": "Retry from the failed step?",
    "resume": "Resume this execution?",
    "resume cancelled": "Resume this execution: forget its cancellation and compensations?",
}


def confirms(admin: Any, detail: ExecutionDetail) -> dict[str, str]:
    """What the retry and resume buttons ask, as ``durable retry``/``resume`` do: the steps the
    action will forget, each that ran (a refund) flagged: forgetting it does not undo it."""
    status, eid = detail.summary.status, detail.summary.id
    resume = _HEADS["resume cancelled" if status in ("cancelled", "timed_out") else "resume"]
    out = {"retry": _HEADS["retry"], "resume": resume}
    if status == "failed":
        out["retry"] = prompt(admin, eid, "retry", _HEADS["retry"])
    if status in ("failed", "cancelled", "timed_out"):
        out["resume"] = prompt(admin, eid, "resume", resume)
    return out
