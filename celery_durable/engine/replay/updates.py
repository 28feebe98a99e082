"""Workflow updates in the replay (issue 27 §4): a request into a running workflow, decided once.

The workflow registers handlers (``wf.set_update_handler(name, fn, validator=)`` or
``@wf.update(name)``) as it registers query handlers: in its body, again on every replay. A
request (``upd:<n>``, engine/signals/updates.py) is decided at a *wait point* (a step's
``result()``, ``gather``): at the history's frontier — no step recorded after the current one —
the requests not decided yet are taken in order. Its arguments are decoded with the handler's
type hints and its validator runs: a failure of either (or no handler of that name) *rejects* it
(``updr:<n>`` create-only, ``accepted: false``; nothing enters the history, no step number is
taken). Otherwise it is *accepted*: the handler runs and the request takes the next step, an
``update`` marker holding its arguments, with the handler's value or error in ``updr:<n>``. A
replay reaching a wait point applies the ``update`` markers recorded right after its current
step again, before it looks at any outcome: the handler rebuilds the same state at the same
point, and the answer stays the one recorded. Handlers and validators are synchronous and take
no durable step (a step raises ``RuntimeError``: a failed update, a rejection).

A query's replay (read-only) applies the recorded updates but decides no new request.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_durable.codecs import CallCodec, fresh
from celery_durable.engine.documents.model import EXEC_ID, error_info, marker_id
from celery_durable.engine.documents.records import count_of, run_of
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.documents.update_docs import (
    publication_id,
    publication_mark_id,
    update_outcome_id,
    update_request_id,
)
from celery_durable.engine.replay.context import ContinueAsNew, Fatal, Suspend, WorkflowContext
from celery_durable.errors import DocumentTooLarge, NonDeterminismError, PayloadTooLarge, PayloadValidationError
from celery_durable.stores.base import Doc, encode_doc

__all__ = ["UpdateHandler", "register", "at_wait", "pending_requests"]


@dataclass(frozen=True)
class UpdateHandler:
    fn: Callable[..., Any]
    validator: Callable[..., Any] | None
    codec: CallCodec


def register(ctx: WorkflowContext, name: str, fn: Callable[..., Any], validator: Callable[..., Any] | None) -> None:
    """``wf.set_update_handler``: the handler of update ``name`` from here on in this replay."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an update name must be a non-empty string, not {name!r}")
    if not callable(fn):
        raise TypeError(f"update handler {name!r} is not callable: {fn!r}")
    if validator is not None and not callable(validator):
        raise TypeError(f"the validator of update {name!r} is not callable: {validator!r}")
    for role, f in (("handler", fn), ("validator", validator)):
        if f is not None and inspect.iscoroutinefunction(f):  # called, it would return a coroutine that never runs
            raise TypeError(f"the {role} of update {name!r} is async: update handlers and validators are synchronous")
    ctx.refuse_in_query(f"wf.set_update_handler({name!r})")
    ctx.update_handlers[name] = UpdateHandler(fn, validator, CallCodec(fn))


def at_wait(ctx: WorkflowContext, max_payload: int | None = None) -> None:
    """A wait point: apply the updates (and take the activities' values) recorded here, then, at
    the frontier, take new ones. ``max_payload``: the store's limit, which an outcome must fit."""
    if ctx.answering is not None or ctx.unwinding:
        return
    ex = ctx.history.get(EXEC_ID) or {}
    if not ctx.update_handlers and not count_of(ex, "update_seq") and not count_of(ex, "published"):
        return  # the common case, at every wait point: nothing to apply or decide
    while (marker := ctx.doc(marker_id(ctx.seq + 1, ctx.run))) is not None and _fed(marker):
        _apply_again(ctx, marker, max_payload)
    if ctx.read_only or ctx.doc(marker_id(ctx.seq + 1, ctx.run)) is not None:
        return  # a query decides nothing; before the frontier, the history decides
    for value in _undecided(ctx, "published", publication_id, publication_mark_id):
        _adopt(ctx, value)
    for request in pending_requests(ctx):
        _decide(ctx, request, max_payload)


def _apply_again(ctx: WorkflowContext, marker: Doc, limit: int | None) -> None:
    """Take the recorded step ``marker`` again: an activity's value (nothing to run), or an
    update, whose handler runs again. Its decision (``apubx:``, ``updr:``) is recorded with it,
    but a commit too large for one batch creates its first documents alone (driver._apply): cut
    short there, the step was recorded without it. Recorded now, from this very application, or
    the value or request would look undecided and be taken a second time."""
    cut = not ctx.read_only
    if marker.get("kind") == StepKind.PUBLISH:
        seq, _ = ctx._step(StepKind.PUBLISH, str(marker["name"]))
        p = int(marker["publication"])
        if cut and ctx.doc(publication_mark_id(p)) is None:
            mark = {"pk": ctx.execution_id, "id": publication_mark_id(p), "type": "publication_mark", "n": p}
            ctx.new_docs[publication_mark_id(p)] = mark | {"run": ctx.run, "seq": seq}
        return
    name = str(marker["name"])
    seq, _ = ctx._step(StepKind.UPDATE, name)
    handler = ctx.update_handlers.get(name)
    if handler is None:
        raise Fatal(
            NonDeterminismError(
                f"workflow {ctx.workflow!r} ({ctx.execution_id}) step {seq}: the history applies update "
                f"{name!r} here but the code has no handler for it registered by this point"
            )
        )
    n = marker.get("request")
    outcome: Doc | None = None
    if cut and isinstance(n, int) and ctx.doc(update_outcome_id(n)) is None:
        outcome = _outcome(ctx, n, name) | {"accepted": True, "seq": seq}
    try:
        args, kwargs = handler.codec.decode_args(fresh(marker.get("input") or {}))
        value = _call(ctx, name, "handler", handler.fn, args, kwargs)
        if outcome is not None:
            outcome.update(ok=True, value=handler.codec.result.encode(value, f"result of update {name!r}", "result"))
    except Exception as exc:  # the recorded answer stands, as its error did when it was decided
        if outcome is not None:
            outcome.update(ok=False, error=error_info(exc))
    if outcome is not None:
        ctx.new_docs[outcome["id"]] = _fitted(outcome, limit)


def _outcome(ctx: WorkflowContext, n: int, name: str) -> Doc:
    """Request ``n``'s outcome document, to be completed by its decision."""
    return {
        "pk": ctx.execution_id,
        "id": update_outcome_id(n),
        "type": "update_outcome",
        "n": n,
        "name": name,
        "run": ctx.run,
        "at": ctx.now,
    }


def _fed(marker: Doc) -> bool:
    """A step taken at a wait point: an accepted update, or an activity's published value."""
    kind = marker.get("kind")
    return kind == StepKind.UPDATE or (kind == StepKind.PUBLISH and marker.get("publication") is not None)


def _undecided(
    ctx: WorkflowContext, counter: str, doc_id: Callable[[int], str], mark_id: Callable[[int], str]
) -> list[Doc]:
    """The documents numbered up to the exec's ``counter`` with no ``mark_id`` yet, oldest first.

    Decided ones are a prefix of the numbers: each is created with the next number in one batch
    with the exec, so a snapshot holding ``n`` holds every one before it, and a frontier decides
    every one it holds (a reset forgets a suffix of them). So looking down from the last number
    stops at the first one decided — or gone: pruned with its run, decided then — and costs the
    pending ones, not the history."""
    found: list[Doc] = []
    for n in range(count_of(ctx.history.get(EXEC_ID) or {}, counter), 0, -1):
        doc = ctx.history.get(doc_id(n))
        if doc is None or ctx.doc(mark_id(n)) is not None:
            break
        found.append(doc)
    return found[::-1]


def pending_requests(ctx: WorkflowContext) -> list[Doc]:
    """The update requests not decided yet, oldest first."""
    return _undecided(ctx, "update_seq", update_request_id, update_outcome_id)


def _adopt(ctx: WorkflowContext, value: Doc) -> None:
    """Take an activity's published value into the stream: a ``publish`` step (not a value of
    another run: dropped, as a value published once its run ended is)."""
    n = int(value["n"])
    mark: Doc = {"pk": ctx.execution_id, "id": publication_mark_id(n), "type": "publication_mark", "n": n}
    mark["run"] = ctx.run
    if run_of(value) == ctx.run:
        topic = str(value["topic"])
        seq, _ = ctx._step(StepKind.PUBLISH, topic)
        origin = {"from_step": value.get("seq"), "attempt": value.get("attempt")}
        ctx._marker(seq, StepKind.PUBLISH, topic, value=fresh(value.get("value")), publication=n, **origin)
        mark["seq"] = seq
    ctx.new_docs[mark["id"]] = mark


def _call(ctx: WorkflowContext, name: str, role: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run an update's validator or handler with durable calls refused."""
    ctx.answering = f"the {role} of update {name!r}"
    try:
        got = fn(*args, **kwargs)
        if inspect.isawaitable(got):  # an async callable not seen as one: its body would never run
            if inspect.iscoroutine(got):
                got.close()
            raise TypeError(f"the {role} of update {name!r} returned an awaitable: it must be synchronous")
        return got
    except (Suspend, Fatal, ContinueAsNew) as exc:  # never the workflow's control flow: the update's failure
        raise RuntimeError(f"the {role} of update {name!r} cannot wait or end the workflow") from exc
    finally:
        ctx.answering = None


def _fitted(outcome: Doc, limit: int | None) -> Doc:
    """``outcome``, or, when it does not fit the store (a handler's value, an error's message),
    its failure with :class:`PayloadTooLarge`: stored anyway, it would fail the execution."""
    if limit is not None:
        try:
            encode_doc(outcome, limit)
        except DocumentTooLarge as exc:
            outcome.pop("value", None)
            outcome.update(ok=False, error=error_info(PayloadTooLarge(str(outcome["id"]), exc.size, limit)))
    return outcome


def _decide(ctx: WorkflowContext, request: Doc, limit: int | None = None) -> None:
    n, name = int(request["n"]), str(request["name"])
    outcome = _outcome(ctx, n, name)
    handler = ctx.update_handlers.get(name)
    try:
        if handler is None:
            known = ", ".join(repr(k) for k in sorted(ctx.update_handlers)) or "none"
            raise LookupError(f"workflow {ctx.workflow!r} has no update handler {name!r} (registered: {known})")
        data = request.get("input")
        if not isinstance(data, dict):
            raise PayloadValidationError(f"update {name!r}: its arguments are not an object of args and kwargs")
        args, kwargs = handler.codec.decode_args(fresh(data))
        if handler.validator is not None:
            _call(ctx, name, "validator", handler.validator, *handler.codec.decode_args(fresh(data)))
    except Exception as exc:  # rejected: recorded outside the history (no step taken: ``seq`` is the one
        # it would have taken, so an operator's reset before it forgets it as it forgets accepted ones)
        outcome.update(accepted=False, ok=False, error=error_info(exc), seq=ctx.seq + 1)
        ctx.new_docs[outcome["id"]] = _fitted(outcome, limit)
        return
    seq, _ = ctx._step(StepKind.UPDATE, name)
    ctx._marker(seq, StepKind.UPDATE, name, input=fresh(data), request=n)
    outcome.update(accepted=True, seq=seq)
    try:
        value = _call(ctx, name, "handler", handler.fn, args, kwargs)
        outcome.update(ok=True, value=handler.codec.result.encode(value, f"result of update {name!r}", "result"))
    except Exception as exc:  # accepted, applied, failed: the caller gets the error
        outcome.update(ok=False, error=error_info(exc))
    ctx.new_docs[outcome["id"]] = _fitted(outcome, limit)
