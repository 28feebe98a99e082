"""Signal channels beyond one name: waiting on several, and sending to another execution
(docs/architecture.md §7).

* :func:`wait_any` is one signal wait over several names: a ``signal`` marker whose ``names``
  lists them (its ``name``, checked on replay, joins them with ``|``). It is decided by the same
  replay logic as ``wait_signal`` (``WorkflowContext._decide_signal``): the oldest valid value
  across the names, in arrival order, is consumed and recorded in one create-only decision
  ``w<run>:<seq>`` naming its channel; the other values stay for later waits.
* :func:`signal_external` is a ``signal_send`` step: its marker (target, name, encoded value) is
  committed by the drive, and the value is sent only after the commit (``Signals.send_signal``,
  as a child's start is) with a signal id derived from sender, run and step; the receiver
  records it once (``sgk:`` dedupe key). The outcome (delivered, or why not) is the step's
  result ``r<run>:<seq>``, create-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_durable.codecs import ValueCodec, fresh
from celery_durable.engine.dispatcher import ClockRequest, SignalRequest
from celery_durable.engine.documents.checks import check_workflow_id
from celery_durable.engine.documents.model import DUE_CHILD, DUE_CLOCK
from celery_durable.engine.documents.schema import external_signal_id, signal_outcome_id, wait_decision_id
from celery_durable.engine.replay.context import DurableFuture, Fatal, WorkflowContext
from celery_durable.errors import ConfigurationError, NonDeterminismError

__all__ = ["wait_any", "signal_external", "ANY_SEPARATOR"]

#: joins the names of a ``wait_any`` into its marker's name (what replay checks)
ANY_SEPARATOR = "|"


def wait_any(
    ctx: WorkflowContext, names: Sequence[str], codecs: dict[str, ValueCodec], timeout_at: float | None
) -> tuple[str, Any]:
    """Wait for the first valid value sent on any of ``names``; return ``(name, value)``."""
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"wait_any needs distinct non-empty signal names, got {list(names)!r}")
    undeclared = [n for n in names if ctx.signal_types and n not in ctx.signal_types]
    if undeclared:
        raise Fatal(
            ConfigurationError(
                f"workflow {ctx.workflow!r} waits for signal(s) {undeclared} but declares only "
                f"{sorted(ctx.signal_types)}: add them to signals={{...}}"
            )
        )
    label = ANY_SEPARATOR.join(names)
    seq, marker = ctx._step("signal", label)
    new = marker is None
    if marker is None:
        marker = ctx._marker(seq, "signal", label, names=list(names), decision=wait_decision_id(seq, ctx.run))
    elif list(marker.get("names") or []) != list(names):
        raise Fatal(
            NonDeterminismError(
                f"workflow {ctx.workflow!r} ({ctx.execution_id}) step {seq}: the history waits for "
                f"{marker.get('names') or marker.get('name')!r} but the code now waits for any of {list(names)!r}"
            )
        )
    decided = ctx._decide_signal(seq, marker, codecs)
    if new and timeout_at is not None and not decided:
        marker.update(fire_at=timeout_at, due_kind=DUE_CLOCK, due_at=timeout_at)
        ctx.sends.append(ClockRequest(ctx.execution_id, seq, timeout_at, ctx.run))
    ctx.at_wait()  # a wait point, whether decided or not: updates apply here as in ctx.outcome
    doc = ctx.doc(signal_outcome_id(marker, ctx.run))
    if doc is None or not doc.get("ok"):
        # no value yet (suspends), a cancel or the timeout (raises): as any signal wait
        ctx.outcome(seq, label, ValueCodec(Any), kind="signal")
        raise AssertionError("unreachable")  # pragma: no cover
    name = str(doc["name"])
    return name, codecs[name].decode(doc.get("value"), f"signal {name!r}")


def signal_external(ctx: WorkflowContext, workflow_id: str, name: str, value: Any) -> DurableFuture[None]:
    """Record (once) a step sending signal ``name`` with ``value`` to ``workflow_id``; the drive
    sends it after its commit. The future ends when the receiver recorded it (or refused it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a signal name must be a non-empty string, not {name!r}")
    seq, marker = ctx._step("signal_send", name)
    if marker is None:
        # start()'s id rules; a derived child id too: a target is never created by the send
        target = check_workflow_id(workflow_id, "signal target workflow id", derived_ok=True)
        data = ValueCodec(Any).encode(value, f"signal {name!r}")
        sid = external_signal_id(ctx.execution_id, ctx.run, seq, ctx.resets)
        due = ctx.now + ctx.activity_queue_timeout  # recovery re-sends a send lost with its process
        ctx._marker(seq, "signal_send", name, target=target, value=data, signal_id=sid, due_kind=DUE_CHILD, due_at=due)
        ctx.sends.append(SignalRequest(ctx.execution_id, seq, ctx.run, target, name, fresh(data), sid))
    elif marker.get("target") != workflow_id:
        raise Fatal(
            NonDeterminismError(
                f"workflow {ctx.workflow!r} ({ctx.execution_id}) step {seq}: the history signals "
                f"{marker.get('target')!r} but the code now signals {workflow_id!r}"
            )
        )
    return DurableFuture(ctx, seq, name, ValueCodec(Any), kind="signal_send")
