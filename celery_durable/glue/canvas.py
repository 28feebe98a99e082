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
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from celery_durable.engine.registry import Registry, add_shared_workflow
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ActivityError, ChildWorkflowError, ConfigurationError

__all__ = ["CANVAS_WORKFLOW", "run_canvas", "check_canvas"]

CANVAS_WORKFLOW = "celery_durable.canvas"
_COMPOSITE = ("chain", "group", "chord")
#: ``prev`` when nothing came before (JSON: a child execution is given it as its input)
_NONE = {"celery_durable.canvas": "no previous result"}


def check_canvas(sig: Any, registry: Registry) -> dict[str, Any]:
    """``sig`` (a Celery signature, or its JSON) as the canvas workflow's input, checked in the
    caller: every node a task (a registered durable activity, its ``args`` a list and ``kwargs`` a
    dict), a chain, a group or a chord with a body; callbacks likewise."""
    try:  # Celery's own JSON of it (a group's generator of members, nested signatures: plain JSON)
        node = json.loads(json.dumps(sig))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the canvas is not JSON: {exc}") from None
    _check(node, registry, "the canvas")
    return dict(node)


def _check(node: Any, registry: Registry, where: str) -> None:
    if not isinstance(node, Mapping):
        raise ConfigurationError(f"{where} holds {node!r:.80}, not a signature (a task, chain, group or chord)")
    kind = node.get("subtask_type")
    if kind in _COMPOSITE:
        members = (node.get("kwargs") or {}).get("header" if kind == "chord" else "tasks")
        if isinstance(members, Mapping):  # a chord's header given as a group
            members = (members.get("kwargs") or {}).get("tasks")
        if not isinstance(members, list):
            raise ConfigurationError(f"{where}: a {kind}'s members must be a list, not {members!r:.80}")
        for child in members:
            _check(child, registry, f"a {kind}")
        if kind == "chord":
            _check((node.get("kwargs") or {}).get("body"), registry, "a chord's body")
    elif kind is not None:
        raise ConfigurationError(f"{where} holds a {kind!r}: a canvas runs tasks, chains, groups and chords only")
    else:
        name = node.get("task")
        if not isinstance(name, str) or registry.activity(name) is None:
            raise ConfigurationError(
                f"{where} calls {name!r}, which is not a durable activity: declare it with @durable_activity"
            )
        if not isinstance(node.get("args") or [], list) or not isinstance(node.get("kwargs") or {}, Mapping):
            raise ConfigurationError(f"{where}: task {name!r} needs its args as a list and its kwargs as a dict")
    for key in ("link", "link_error"):
        for cb in _listed((node.get("options") or {}).get(key)):
            _check(cb, registry, f"a {key} callback")


def _listed(value: Any) -> list[Any]:
    """A callback option as Celery takes it: one signature or a list of them."""
    if value is None:
        return []
    return [value] if isinstance(value, Mapping) else list(value)


def _children(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    kind, kw = node.get("subtask_type"), node.get("kwargs") or {}
    if kind == "chord":
        header = kw.get("header")
        return list(_children(header) if isinstance(header, Mapping) else header or [])
    return list(kw.get("tasks") or [])


def run_canvas(canvas: dict[str, Any], prev: Any = _NONE) -> Any:
    """The canvas workflow: ``canvas`` applied as Celery applies it; ``prev``: a previous result
    (a group member run as a child execution is given its group's). An empty chain gives None."""
    result = _run(canvas, prev)
    return None if result == _NONE else result


def _run(node: Mapping[str, Any], prev: Any) -> Any:
    """A node's result: its own (a task's, a chain's last, a group's list, a chord's body's), its
    ``link`` callbacks run with it, its ``link_error`` errbacks run when it fails."""
    kind = node.get("subtask_type")
    if kind not in _COMPOSITE:
        return _settle(node, _start(node, prev))
    return _linked(node, lambda: _composite(node, kind, prev))


def _composite(node: Mapping[str, Any], kind: str, prev: Any) -> Any:
    if kind == "chain":
        value = prev
        for child in _children(node):
            value = _run(child, value)
        return value
    if kind == "group":
        return _group(_children(node), prev)
    body = node["kwargs"]["body"]
    try:
        header = _group(_children(node), prev)
    except (ActivityError, ChildWorkflowError):
        _errbacks(body)  # Celery calls the body's errbacks when the header fails (chord.link_error)
        raise
    return _run(body, header)


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
    return _linked(node, future.result)


def _linked(node: Mapping[str, Any], outcome: Callable[[], Any]) -> Any:
    """``outcome()`` (a task's result, a composite's), with ``node``'s ``link`` callbacks run after
    a success and its ``link_error`` errbacks after a failure, which then goes on."""
    try:
        value = outcome()
    except (ActivityError, ChildWorkflowError):
        _errbacks(node)
        raise
    _callbacks(node, value)
    return value


def _callbacks(node: Mapping[str, Any], value: Any) -> None:
    """``link``: run with the result; one that fails is its own failure, not the node's (in Celery
    a callback is a task of its own)."""
    for callback in _listed((node.get("options") or {}).get("link")):
        try:
            _run(callback, value)
        except (ActivityError, ChildWorkflowError):
            pass  # recorded in the history (its step's failure); the canvas goes on


def _errbacks(node: Mapping[str, Any]) -> None:
    """``link_error``: compensations, with their own arguments; one that fails does not replace
    the failure being handled."""
    for errback in _listed((node.get("options") or {}).get("link_error")):
        try:
            _run(dict(errback, immutable=True), _NONE)
        except (ActivityError, ChildWorkflowError):
            pass  # recorded in the history; the original failure goes on


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
        except (ActivityError, ChildWorkflowError) as exc:
            failure = failure or exc
            results.append(None)
    if failure is not None:
        raise failure
    return results


CANVAS = add_shared_workflow(CANVAS_WORKFLOW, run_canvas)
