"""Workflow updates, the caller's side (issue 27 §4): send a request, wait for its outcome.

:meth:`Updates.send` records the request ``upd:<n>`` in one batch with a bump of the exec
(``update_seq``, ``wakeups``), conditional on the exec's etag — the way a signal value is
recorded (engine/signals/inbox.py) — so a request racing continue-as-new or the end is either
recorded where the execution will read it, or refused; then it sends a drive. Requests are not
bound to a run: one the ending run did not decide is decided by the next (continue-as-new).
The replay decides it (engine/replay/updates.py) and writes ``updr:<n>`` create-only;
:meth:`Updates.outcome` waits for it (woken by the notifier, else polling) and turns it into the
handler's value, :class:`UpdateRejectedError` or :class:`UpdateFailedError`; an execution that
ended without deciding it gives :class:`UpdateRefusedError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.codecs import ValueCodec
from celery_durable.engine.documents.checks import check_exec
from celery_durable.engine.documents.model import EXEC_ID, run_of
from celery_durable.engine.documents.records import count_of, is_terminal
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.documents.update_docs import (
    check_step_fits,
    update_key_id,
    update_outcome_id,
    update_request_id,
)
from celery_durable.engine.drive.upkeep import bumped
from celery_durable.engine.starts.deadlines import check_seconds
from celery_durable.errors import (
    ConflictError,
    DurableError,
    UnknownWorkflowError,
    UpdateFailedError,
    UpdateRefusedError,
    UpdateRejectedError,
)
from celery_durable.stores.base import Doc, Op
from celery_durable.stores.push.base import wait_for

if TYPE_CHECKING:
    from celery_durable.engine.documents.records import ExecDoc
    from celery_durable.engine.ports import EngineParts
    from celery_durable.stores.push.base import Notifier

    class Engine(EngineParts, Protocol):
        notifier: Notifier


__all__ = ["Updates", "request_doc", "check_update_name", "check_update_id", "check_timeout", "check_request_fits"]

_ANY = ValueCodec(Any)
MAX_NAME = 256


def check_update_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ValueError(f"an update name is a string of 1-{MAX_NAME} characters, not {name!r:.60}")
    return name


def check_timeout(timeout: object) -> float | None:
    """How long a caller waits for an outcome (seconds or a ``timedelta``; None: no end), checked
    before the request is sent: a negative one would send it and give up at once, NaN never."""
    return check_seconds("an update's timeout", timeout, zero_ok=True)


def check_update_id(update_id: object) -> str | None:
    """An ``update_id`` is a string (or None): a clear error here, not one from its digest."""
    if update_id is not None and not isinstance(update_id, str):
        raise TypeError(f"update_id is a string naming the request, not {type(update_id).__name__} {update_id!r:.60}")
    return update_id


def check_request_fits(engine: EngineParts, execution_id: str, name: str, data: dict[str, Any]) -> None:
    """:class:`PayloadTooLarge` in the caller when the ``update`` step applying these arguments
    would not fit the store (the request itself may: the step would fail the execution)."""
    check_step_fits(engine.store, execution_id, StepKind.UPDATE, name, {"input": data}, ("request",))


def request_doc(execution_id: str, n: int, run: int, name: str, data: dict[str, Any], now: float) -> Doc:
    """The request document ``upd:<n>`` (its arguments ``data`` encoded already)."""
    return {
        "pk": execution_id,
        "id": update_request_id(n),
        "type": "update_request",
        "n": n,
        "name": name,
        "input": data,
        "run": run,
        "sent_at": now,
    }


def encode_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's arguments as JSON (typed by the handler where it is decided)."""
    return {"args": _ANY.encode(list(args), f"arguments of update {name!r}"), "kwargs": _ANY.encode(kwargs, "")}


class Updates:
    """Send update requests to executions and wait for their outcomes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def bumped(self, ex: ExecDoc, n: int, now: float) -> Doc:
        """The exec as a request recording ``n`` rewrites it (a drive is due if none was)."""
        return bumped(ex, now, self.engine.settings.drive_timeout, update_seq=n)

    def send(
        self,
        execution_id: str,
        name: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        update_id: str | None = None,
    ) -> int:
        """Record update request ``name(*args, **kwargs)`` and drive the execution; its number.

        :class:`UnknownWorkflowError` for a missing id, :class:`UpdateRefusedError` for an ended
        execution; ``update_id`` makes a resend find the first request (and return its number)."""
        check_update_name(name)
        check_update_id(update_id)
        data = encode_args(name, args, kwargs or {})
        eng = self.engine
        check_request_fits(eng, execution_id, name, data)
        key = None if update_id is None else update_key_id(update_id)
        for _ in range(100):
            docs = eng.cache.load(execution_id)
            ex = check_exec(execution_id, docs.get(EXEC_ID))
            if ex is None:
                raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
            if key is not None and key in docs:
                return int(docs[key]["n"])  # this very request was sent before
            if is_terminal(ex):
                raise UpdateRefusedError(execution_id, name, f"the execution has ended ({ex.get('status')})")
            now = eng.clock.now()
            n = count_of(ex, "update_seq") + 1
            doc = request_doc(execution_id, n, run_of(ex), name, data, now)
            ops = [Op.create(doc), Op.replace(self.bumped(ex, n, now), if_match=ex["_etag"])]
            if key is not None:
                doc["update_id"] = uid = str(update_id)
                ops.insert(
                    0, Op.create({"pk": execution_id, "id": key, "type": "update_key", "n": n, "update_id": uid})
                )
            try:
                eng.store.batch(execution_id, ops)
            except ConflictError:
                eng.cache.suspect(execution_id)
                continue  # the execution moved on (a drive, continue-as-new, another sender): look again
            eng.emit("update_received", execution_id=execution_id, name=name)
            eng.dispatcher.send_drive(execution_id)
            return n
        raise DurableError(f"could not record update {name!r} for {execution_id!r}: too much contention")

    def decided(self, execution_id: str, n: int) -> Doc | None:
        """Request ``n``'s outcome, or None while it is undecided (UpdateRefusedError once the
        execution ended without deciding it)."""
        store = self.engine.store
        outcome = store.read(execution_id, update_outcome_id(n))
        if outcome is not None:
            return outcome
        ex = store.read(execution_id, EXEC_ID)
        if ex is None:
            raise UnknownWorkflowError(f"no execution with id {execution_id!r} (purged?)")
        if is_terminal(ex):
            # the outcome is committed with (or before) the commit that ended it: read it again
            outcome = store.read(execution_id, update_outcome_id(n))
            if outcome is None:
                request = store.read(execution_id, update_request_id(n)) or {}
                name = str(request.get("name", "?"))
                raise UpdateRefusedError(
                    execution_id, name, f"the execution ended ({ex.get('status')}) before it handled the update"
                )
        return outcome

    def outcome(self, execution_id: str, n: int, timeout: float | None = None) -> Any:
        """Wait for request ``n``'s outcome: the handler's value (JSON) or its error raised."""
        eng = self.engine
        timeout = check_timeout(timeout)
        doc = wait_for(
            eng.notifier,
            execution_id,
            lambda: self.decided(execution_id, n),
            timeout,
            eng.settings.result_push_recheck,
            eng.settings.result_poll_max,
            lambda: f"update {n} of {execution_id!r} not handled after {timeout}s",
        )
        return answer(execution_id, doc)


def answer(execution_id: str, doc: Doc) -> Any:
    """An outcome document as the caller gets it: the value, or the error raised."""
    name, err = str(doc.get("name")), doc.get("error") or {}
    type_name, message = str(err.get("type", "Error")), str(err.get("message", ""))
    if not doc.get("accepted"):
        raise UpdateRejectedError(execution_id, name, type_name, message)
    if not doc.get("ok"):
        raise UpdateFailedError(execution_id, name, type_name, message)
    return doc.get("value")
