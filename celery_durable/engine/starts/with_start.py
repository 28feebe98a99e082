"""Signal-with-start and update-with-start (issue 27 §4): start an execution with its first
signal value or update request, atomically, or signal/update the running one.

When the id does not exist, the exec and the first value (``sgv:000001``, ``signal_seq: 1``) or
request (``upd:000001``, ``update_seq: 1``) are created in ONE store batch (``Engine.start``'s
``first``): never an execution without its signal, never a signal lost. When the create finds the
id taken (it exists, or a racing caller created it first), the value is sent to that execution as
any signal or update is, conditional on its exec's etag: two racing callers make one execution
and both values are recorded. An id of another workflow is refused (``ConfigurationError``); an
ended execution refuses the value (:class:`ExecutionEndedError`, :class:`UpdateRefusedError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.checks import signal_value_id
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.records import is_terminal
from celery_durable.engine.documents.update_docs import update_key_id
from celery_durable.engine.signals.inbox import check_signal_fits, check_signal_name, encode_signal
from celery_durable.engine.signals.updates import (
    check_request_fits,
    check_update_id,
    check_update_name,
    encode_args,
    request_doc,
)
from celery_durable.errors import DurableError, ExecutionEndedError

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine
    from celery_durable.engine.registry import WorkflowDef

__all__ = ["signal_with_start", "update_with_start"]


def _start(
    engine: Engine,
    workflow: WorkflowDef,
    eid: str,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    start: dict[str, Any],
    first: tuple[list[dict[str, Any]], dict[str, Any]],
) -> bool:
    """Create ``eid`` with ``first``; False when the id exists (of this workflow: else refused)."""
    _, created = engine.start(workflow, call[0], call[1], workflow_id=eid, first=first, **start)
    return created


def signal_with_start(
    engine: Engine,
    workflow: WorkflowDef,
    eid: str,
    name: str,
    value: Any,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    start: dict[str, Any],
) -> bool:
    """Start ``eid`` with signal ``name`` or signal it; True when this call created it."""
    check_signal_name(workflow.name, workflow.signal_names, name)
    data = encode_signal(workflow, name, value)
    check_signal_fits(engine.store, eid, name, data)
    doc = {"pk": eid, "id": signal_value_id(1), "type": "signal_value", "name": name, "n": 1, "run": 0}
    doc.update(value=data, sent_at=engine.clock.now())
    if _start(engine, workflow, eid, call, start, ([doc], {"signal_seq": 1})):
        engine.emit("signal_received", execution_id=eid, name=name)
        return True
    if engine.signals.signal(eid, name, value):  # it exists (ours): signalled as any signal
        return False
    ex = engine.read_exec(eid)
    # not ended: past its deadline, its timeout not delivered yet (the signal is ignored then)
    why = f"has ended ({ex.get('status')})" if is_terminal(ex) else "is past its deadline (it times out)"
    raise ExecutionEndedError(eid, f"signal {name!r} not recorded: the execution {why}")


def update_with_start(
    engine: Engine,
    workflow: WorkflowDef,
    eid: str,
    name: str,
    args: tuple[Any, ...],
    call: tuple[tuple[Any, ...], dict[str, Any]],
    start: dict[str, Any],
    update_id: str | None = None,
) -> tuple[int, bool]:
    """Start ``eid`` with update request ``name(*args)`` or send it; its number, and whether this
    call created the execution. The caller waits for its outcome (``Updates.outcome``).
    ``update_id``: its key (``updk:``) is created with the request, so a resend — after a call
    that raised but applied — finds the request instead of sending a second one."""
    check_update_name(name)
    check_update_id(update_id)
    data = encode_args(name, args, {})
    check_request_fits(engine, eid, name, data)
    docs = [request_doc(eid, 1, 0, name, data, engine.clock.now())]
    if update_id is not None:
        docs[0]["update_id"] = update_id
        docs.append({"pk": eid, "id": update_key_id(update_id), "type": "update_key", "n": 1, "update_id": update_id})
    if _start(engine, workflow, eid, call, start, (docs, {"update_seq": 1})):
        engine.emit("update_received", execution_id=eid, name=name)
        return 1, True
    if engine.store.read(eid, EXEC_ID) is None:  # pragma: no cover - ids are never deleted but by a purge
        raise DurableError(f"execution {eid!r} vanished while it was started")
    return engine.updates.send(eid, name, args, update_id=update_id), False
