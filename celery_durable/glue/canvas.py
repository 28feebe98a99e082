"""A Celery canvas run durably (``durable.run(chain(a.s(x), group(b.s(), c.s()), d.s()))``).

The signature tree (Celery's own JSON of it: ``task``, ``args``, ``kwargs``, ``options``,
``subtask_type``, ``immutable``) is the input of the shared workflow ``celery_durable.canvas``,
which walks it as Celery would apply it, each task an activity step of the execution:

- a **task** is an activity (it must be a ``@durable_activity``: checked at ``run()``), called with
  the previous result first unless it is immutable (``.si``); its ``link`` callbacks run after it
  with its result, its ``link_error`` errbacks run when it fails for good (a compensation: with
  their own arguments), then the failure goes on;
- a **chain** passes each result on; a **group** starts every member at once (a task as an
  activity, a nested chain/group/chord as a child execution) and waits for all; a **chord** is
  its header group, then its body with the list of results.

Each task keeps its own retry options and routing (``autoretry_for``, ``task_routes``); what it
returned is recorded first-writer-wins, so a killed worker re-runs nothing that finished. A chord
cannot hang: its header is a gather inside one execution — every member ends (a result, or a
failure after its retries) and the body runs or the failure is raised; no result backend counts
the members (celery#3146, #4401).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from celery_durable.engine.registry import Registry, add_shared_workflow
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ActivityError, ConfigurationError, DurableError

__all__ = ["CANVAS_WORKFLOW", "run_canvas", "check_canvas"]

CANVAS_WORKFLOW = "celery_durable.canvas"
_COMPOSITE = ("chain", "group", "chord")
#: ``prev`` when nothing came before (JSON: a child execution is given it as its input)
_NONE = {"celery_durable.canvas": "no previous result"}


def check_canvas(sig: Any, registry: Registry) -> dict[str, Any]:
    """``sig`` (a Celery signature, or its JSON) as the canvas workflow's input, checked in the
    caller: every task a registered durable activity, every node a task, chain, group or chord."""
    try:  # Celery's own JSON of it (a group's generator of members, nested signatures: plain JSON)
        node = json.loads(json.dumps(sig))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the canvas is not JSON: {exc}") from None
    if not isinstance(node, dict):
        raise ConfigurationError(f"durable.run() takes a Celery signature (a task, chain, group or chord), not {sig!r}")
    _check(node, registry, "the canvas")
    return node


def _check(node: Mapping[str, Any], registry: Registry, where: str) -> None:
    kind = node.get("subtask_type")
    if kind in _COMPOSITE:
        for child in _children(node):
            _check(child, registry, f"a {kind}")
        if kind == "chord":
            _check(node["kwargs"]["body"], registry, "a chord's body")
    elif kind is not None:
        raise ConfigurationError(f"{where} holds a {kind!r}: a canvas runs tasks, chains, groups and chords only")
    else:
        name = node.get("task")
        if not isinstance(name, str) or registry.activity(name) is None:
            raise ConfigurationError(
                f"{where} calls {name!r}, which is not a durable activity: declare it with @durable_activity"
            )
    for key in ("link", "link_error"):
        for cb in (node.get("options") or {}).get(key) or []:
            _check(cb, registry, f"a {key} callback")


def _children(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    kind, kw = node.get("subtask_type"), node.get("kwargs") or {}
    if kind == "chord":
        header = kw.get("header")
        return list(_children(header) if isinstance(header, Mapping) else header or [])
    return list(kw.get("tasks") or [])


def run_canvas(canvas: dict[str, Any], prev: Any = _NONE) -> Any:
    """The canvas workflow: ``canvas`` applied as Celery applies it; ``prev``: a previous result
    (a group member run as a child execution is given its group's)."""
    return _run(canvas, prev)


def _run(node: Mapping[str, Any], prev: Any) -> Any:
    kind = node.get("subtask_type")
    if kind == "chain":
        value = prev
        for child in _children(node):
            value = _run(child, value)
        return value
    if kind == "group":
        return _group(_children(node), prev)
    if kind == "chord":
        return _run(node["kwargs"]["body"], _group(_children(node), prev))
    return _settle(node, _start(node, prev))


def _start(node: Mapping[str, Any], prev: Any) -> Any:
    """A task's step (an activity future); ``prev`` first unless it is immutable."""
    args = list(node.get("args") or [])
    if prev != _NONE and not node.get("immutable"):
        args = [prev, *args]
    options = dict(node.get("options") or {})
    sig = SimpleNamespace(task=node["task"], args=args, kwargs=dict(node.get("kwargs") or {}), options=options)
    return require_context("durable.run()").start_signature(sig)


def _settle(node: Mapping[str, Any], future: Any) -> Any:
    """Wait for a task; its ``link`` callbacks after a success, its ``link_error`` after a failure."""
    options = node.get("options") or {}
    try:
        value = future.result()
    except (ActivityError, DurableError):
        for errback in options.get("link_error") or []:
            _run(dict(errback, immutable=True), _NONE)  # a compensation, with its own arguments
        raise
    for callback in options.get("link") or []:
        _run(callback, value)
    return value


def _group(members: list[Mapping[str, Any]], prev: Any) -> list[Any]:
    """Start every member, wait for all (each task's callbacks run as it is awaited, in order);
    the results in order, or the first failure once all have ended."""
    ctx = require_context("durable.run()")
    started: list[tuple[Mapping[str, Any], Any]] = []
    for member in members:
        if member.get("subtask_type") in _COMPOSITE:
            definition = ctx.registry.workflow(CANVAS_WORKFLOW)
            assert definition is not None
            started.append((member, ctx.start_child(definition, (dict(member), prev), {}, None)))
        else:
            started.append((member, _start(member, prev)))
    results: list[Any] = []
    failure: BaseException | None = None
    for member, future in started:
        try:
            if member.get("subtask_type") in _COMPOSITE:
                results.append(future.result())
            else:
                results.append(_settle(member, future))
        except (ActivityError, DurableError) as exc:
            failure = failure or exc
            results.append(None)
    if failure is not None:
        raise failure
    return results


CANVAS = add_shared_workflow(CANVAS_WORKFLOW, run_canvas)
