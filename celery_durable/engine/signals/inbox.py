"""Workflow signals arriving: a sent value recorded with its execution, and what a replay rejected.

Signals are values *sent* to an execution (``sgv:<n>``, recorded atomically with the exec) and
*consumed* one by one by the replays of successive waits, each recording its own decision
``w<run>:<seq>`` create-only; see :meth:`Signals.signal`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.admin.oplog import signal_op
from celery_durable.engine.dispatcher import SignalRequest
from celery_durable.engine.documents.checks import (
    check_exec,
    signal_value_id,
)
from celery_durable.engine.documents.model import (
    EXEC_ID,
    run_of,
)
from celery_durable.engine.documents.records import count_of, is_terminal
from celery_durable.engine.documents.schema import NOT_STARTED, DocType, signal_key_id, wait_decision_id
from celery_durable.engine.documents.update_docs import WIDE, WIDE_TIME, check_fits
from celery_durable.engine.drive.upkeep import bumped as bumped_exec
from celery_durable.engine.signals.external import send_signal
from celery_durable.errors import (
    ConflictError,
    DurableError,
    PayloadValidationError,
    UnknownWorkflowError,
)
from celery_durable.stores.base import Doc, Op, Store

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts
    from celery_durable.engine.registry import WorkflowDef


__all__ = ["Signals", "declared_signals", "check_signal_name", "encode_signal", "check_signal_fits"]

log = logging.getLogger("celery_durable.links")


def declared_signals(ex: Mapping[str, Any], wf: WorkflowDef | None) -> list[str] | None:
    """The signal names an execution accepts, or ``None`` for any name.

    The starter records them in the exec document (``signals``); a workflow declaring none
    accepts any name, typed by ``wait_signal(name, type)`` where it is consumed. An exec
    written before names were recorded falls back to the local definition, if any.
    """
    if "signals" in ex:
        names = ex.get("signals")
        return list(names) if names else None
    return wf.signal_names if wf is not None else None


def check_signal_name(workflow: str, names: list[str] | None, name: str) -> None:
    """:class:`PayloadValidationError` in the sender for a name the workflow does not declare."""
    if names is not None and name not in names:
        raise PayloadValidationError(
            f"workflow {workflow!r} declares no signal {name!r} (declared: {', '.join(names)})"
        )


def encode_signal(wf: WorkflowDef | None, name: str, value: Any, typed: bool = True) -> Any:
    """A signal value's JSON, validated against the type ``wf`` declares for ``name`` (if any and
    ``typed``; otherwise as any JSON, typed where it is consumed)."""
    declared = wf.signals.get(name, Any) if typed and wf is not None and name in wf.signals else Any
    return ValueCodec(declared).encode(value, f"signal {name!r}")


def check_signal_fits(store: Store, execution_id: str, name: str, data: Any) -> None:
    """:class:`PayloadTooLarge` in the sender when the decision of the wait that consumes this
    value (``w:<seq>``: the value with its step, times and id) would not fit the store: recorded
    anyway, that decision would fail the execution's commit, and with it the execution."""
    probe = {"pk": execution_id, "id": wait_decision_id(WIDE, WIDE), "type": "signal", "run": WIDE, "seq": WIDE}
    probe.update(name=name, ok=True, value=data, value_id=signal_value_id(WIDE), sent_at=WIDE_TIME)
    check_fits(store, probe | {"received_at": WIDE_TIME}, f"the wait decision consuming signal {name!r}")


class Signals:
    """Record signal values sent to executions (by clients, operators and ``wf.signal_external``)."""

    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def signal(
        self,
        execution_id: str,
        name: str,
        value: Any,
        signal_id: str | None = None,
        sender: dict[str, Any] | None = None,
        by: str | None = None,
    ) -> bool:
        """Send signal ``name``; True when the value is recorded, False when it is ignored.
        ``by``: the operator sending it, recorded in the same batch (engine/admin/oplog.py).

        Every value is kept, in arrival order, and each ``wait_signal(name)`` consumes the next
        *valid* one (a channel, like DBOS ``recv`` and Temporal signal handlers). Validation
        happens where the value is consumed (the replay of the wait, against the wait's type): an
        invalid value is recorded as rejected (``sgx:<n>``, type ``signal_rejected``, the
        ``signal_rejected`` event fires) and the wait goes on, so a corrected value still gets
        through. A sender that knows the workflow also validates here (bad value:
        :class:`PayloadValidationError`). Names the workflow does not declare are refused
        (:class:`PayloadValidationError`) by every sender: the exec lists them.

        The value document is created in one batch with a bump of the exec, conditional on the
        exec's etag, so it is either refused or recorded against the state it was checked with
        (never for a run that has just been replaced by continue-as-new). Values are not bound to
        a run: one sent for a name the current run never waits for is carried over to the next
        run (continue-as-new), like Temporal's and DBOS's unconsumed signals. False means the
        execution has ended (the ``signal_ignored`` event fires).

        ``signal_id`` (``wf.signal_external``: derived from the sending step) makes the send
        idempotent: a key document ``sgk:<digest>`` is created in the same batch, and a send
        that finds it recorded returns True and records nothing. Such a value is JSON already
        (validated where it is consumed).
        """
        eng = self.engine
        for _ in range(100):
            eng.read_exec(execution_id)  # a clear UnknownWorkflowError for a wrong id
            docs = eng.cache.load(execution_id)  # one consistent snapshot, exec etag included
            ex = check_exec(execution_id, docs.get(EXEC_ID))
            if ex is None:
                raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
            wf = eng.registry.workflow(str(ex["workflow"]))
            names = declared_signals(ex, wf)
            check_signal_name(str(ex["workflow"]), names, name)
            key = signal_key_id(signal_id) if signal_id is not None else None
            if key is not None and key in docs:
                return True  # this very send was recorded before (a retried send)
            data = encode_signal(wf, name, value, typed=signal_id is None)
            check_signal_fits(eng.store, execution_id, name, data)
            if is_terminal(ex):
                return self._ignored(execution_id, name, str(ex["status"]))
            # a top-level one not started yet (scheduled, queued on a limit): its deadline moves with its start
            at = ex.get("deadline_at") if ex.get("parent") or ex.get("status") not in NOT_STARTED else None
            if isinstance(at, int | float) and at <= eng.clock.now() and not ex.get("timed_out"):
                # past its deadline, the timeout not delivered yet: the next drive delivers it
                # where the workflow waits, before it could consume this (engine/starts/deadlines.py)
                return self._ignored(execution_id, name, "its deadline passed")
            run = run_of(ex)
            n = count_of(ex, "signal_seq") + 1
            now = eng.clock.now()
            doc: Doc = {
                "pk": execution_id,
                "id": signal_value_id(n),
                "type": "signal_value",
                "name": name,
                "n": n,
                "run": run,
                "value": data,
                "sent_at": now,
            }
            bumped = bumped_exec(ex, now, eng.settings.drive_timeout, signal_seq=n)
            record = [] if by is None else [signal_op(ex, docs, bumped, by, name, now)]
            ops = [Op.create(doc), *record, Op.replace(bumped, if_match=ex["_etag"])]
            if key is not None:
                doc.update(signal_id=signal_id, sender=sender)
                ops.insert(
                    0, Op.create({"pk": execution_id, "id": key, "type": DocType.SIGNAL_KEY, "value_id": doc["id"]})
                )
            try:
                eng.store.batch(execution_id, ops)
            except ConflictError:
                continue  # the execution moved on (a drive, continue-as-new, another sender): look again
            eng.emit("signal_received", execution_id=execution_id, name=name)
            eng.dispatcher.send_drive(execution_id)
            return True
        raise DurableError(f"could not record signal {name!r} for {execution_id!r}: too much contention")

    def send_signal(self, req: SignalRequest) -> None:
        """Carry out a committed ``wf.signal_external`` step (see :func:`.sends.send_signal`)."""
        send_signal(self.engine, self.signal, req)

    def _ignored(self, execution_id: str, name: str, reason: str) -> bool:
        log.warning("signal %r to %s ignored: %s", name, execution_id, reason)
        self.engine.emit("signal_ignored", execution_id=execution_id, name=name, reason=reason)
        return False

    def after_commit(self, execution_id: str, new_docs: list[Doc]) -> None:
        """Events for signal values a committed replay rejected or ignored (once: create-only)."""
        for doc in new_docs:
            if doc.get("type") == "signal_rejected":
                reason = str((doc.get("error") or {}).get("message", ""))
                log.warning("signal %r to %s rejected: %s", doc["name"], execution_id, reason)
                self.engine.emit("signal_rejected", execution_id=execution_id, name=doc["name"], reason=reason)
            elif doc.get("type") == "signal_ignored":
                self._ignored(execution_id, str(doc["name"]), str(doc.get("reason", "superseded")))
            elif doc.get("type") == "update_outcome":  # wakes the caller waiting for it (Engine._publish_end)
                self.engine.emit("update_settled", execution_id=execution_id, name=doc["name"], n=doc["n"])
