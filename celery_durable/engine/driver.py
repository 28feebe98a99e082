"""Driving an execution: replay, then commit what replay decided (DESIGN.md §6).

The common path is optimistic and costs one partition read and one all-or-nothing batch:
read the partition, replay the function, then commit ``[create new steps…, replace exec
if-match]``. Messages are sent only *after* the commit, so a concurrent drive that loses the
race never schedules anything.

Under contention the drive takes the exec lease instead (an etag replace): others then only
record their documents and bump the wake-up counter, which changes the exec etag, so the
lease holder's releasing commit fails, it re-reads and drives again. That is the "no lost
wake-ups" rule: a completion is either seen by a drive that commits after it, or it bumps
the exec so the next commit must re-read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, CorruptDocument, PayloadValidationError, WorkflowCancelledError
from ..observability import span
from ..stores.base import Doc, Op, strip_reserved
from .context import ContinueAsNew, Fatal, Send, Suspend, WorkflowContext
from .model import (
    CANCELLED,
    COMPLETED,
    DUE_EXEC,
    EXEC_ID,
    FAILED,
    RUNNING,
    TERMINAL,
    error_info,
    lease_live,
    marker_id,
    settled,
    worker_identity,
)

if TYPE_CHECKING:
    from .core import Engine

__all__ = ["Driver", "Replay"]

log = logging.getLogger("celery_durable.drive")

MAX_ROUNDS = 500


@dataclass
class Replay:
    kind: str  # completed | failed | cancelled | suspended | unknown | continued
    value: Any = None
    error: dict[str, Any] | None = None
    new_docs: list[Doc] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    steps: int = 0
    #: the new payload, for ``continued``
    payload: dict[str, Any] | None = None


class Driver:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- replay -------------------------------------------------------------------------

    def replay(self, ex: Doc, history: dict[str, Doc], now: float) -> Replay:
        eng = self.engine
        wf = eng.registry.workflow(ex["workflow"])
        if wf is None:
            return Replay("unknown")
        ctx = WorkflowContext(
            execution_id=ex["pk"],
            workflow=wf.name,
            history=history,
            now=now,
            registry=eng.registry,
            cancel_requested=bool(ex.get("cancel_requested")),
            activity_queue_timeout=eng.settings.activity_queue_timeout,
            run=int(ex.get("run") or 0),
            signal_types=wf.signals,
        )
        try:
            args, kwargs = wf.codec.decode_args(ex.get("payload") or {})
        except (PayloadValidationError, TypeError, AttributeError) as exc:
            err = CorruptDocument(f"stored payload of {ex['pk']!r} cannot be decoded: {exc}")
            return Replay("failed", error=error_info(err))
        kind, value, error, payload = "completed", None, None, None
        with ctx:
            try:
                result = wf.fn(*args, **kwargs)
            except Suspend:
                kind = "suspended"
            except ContinueAsNew as cont:
                kind, payload = "continued", cont.payload
            except Fatal as fatal:
                kind, error = "failed", error_info(fatal.error)
            except WorkflowCancelledError as exc:
                kind, error = ("cancelled" if ctx.cancel_requested else "failed"), error_info(exc)
            except Exception as exc:  # the workflow's own failure is its outcome
                kind, error = "failed", error_info(exc)
            else:
                recorded = int(ex.get("steps") or 0)
                if recorded > ctx.seq:
                    kind = "failed"
                    error = {
                        "type": "NonDeterminismError",
                        "message": f"workflow {wf.name!r} returned after {ctx.seq} steps but the history "
                        f"has {recorded}: the code changed under a running execution",
                    }
                else:
                    try:
                        value = wf.codec.encode_result(result)
                    except PayloadValidationError as exc:
                        kind, error = "failed", error_info(exc)
        return Replay(
            kind,
            value=value,
            error=error,
            new_docs=list(ctx.new_docs.values()),
            sends=ctx.sends,
            steps=ctx.seq,
            payload=payload,
        )

    # --- drive --------------------------------------------------------------------------

    def drive(
        self,
        execution_id: str,
        carry: Sequence[Doc] = (),
        release: Sequence[int] = (),
        trust_cache: float = 0.0,
    ) -> str:
        """Drive once to a suspension or an end; ``carry`` are documents to record with it.

        Returns what happened: completed, failed, cancelled, suspended, deferred (another
        worker holds the lease and will see our documents), noop, terminal, missing,
        unknown (workflow not registered here), lease-lost.
        """
        eng = self.engine
        store = eng.store
        me = worker_identity()
        holding = False
        conflicts = 0
        carry = list(carry)
        release = list(release)
        orphan_sends: dict[str, Send] = {}
        try:
            for round_ in range(MAX_ROUNDS):
                try:
                    cached = eng.cache.peek(execution_id, trust_cache) if round_ == 0 and trust_cache else None
                    docs = cached if cached is not None else eng.cache.load(execution_id)
                except CorruptDocument as exc:
                    self.fail_corrupt(execution_id, exc)
                    return "failed"
                ex = docs.get(EXEC_ID)
                carry_new = [d for d in carry if d["id"] not in docs]
                if ex is None:
                    log.error("drive %s: no such execution", execution_id)
                    return "missing"
                if ex.get("status") in TERMINAL:
                    self._record(carry_new)
                    return "terminal"
                now = eng.clock.now()
                lease: dict[str, Any] = ex.get("lease") or {}
                mine = lease.get("holder") == me
                if holding and not mine:
                    log.warning("drive %s: lease lost to %s", execution_id, lease.get("holder"))
                    return "lease-lost"
                if not mine and lease_live(ex, now):
                    # someone else is driving: record ours, then bump so their release re-reads
                    self._record(carry_new)
                    self._release_each(docs, release)
                    carry, release = [], []
                    bumped = strip_reserved(ex) | {"wakeups": int(ex.get("wakeups") or 0) + 1}
                    try:
                        store.replace(bumped, if_match=ex["_etag"])
                    except ConflictError:
                        continue
                    return "deferred"
                if not holding and conflicts >= eng.settings.optimistic_attempts:
                    # contention: persist ours, then take the lease so others defer to us
                    self._record(carry_new)
                    self._release_each(docs, release)
                    carry, release = [], []
                    claimed = strip_reserved(ex) | {
                        "lease": {"holder": me, "expires": now + eng.settings.lease_ttl},
                        "due_kind": DUE_EXEC,
                        "due_at": now + eng.settings.lease_ttl,
                    }
                    try:
                        store.replace(claimed, if_match=ex["_etag"])
                        holding = True
                    except ConflictError:
                        pass
                    continue
                history = dict(docs)
                for d in carry_new:
                    history[d["id"]] = d
                try:
                    replay = self.replay(ex, history, now)
                    ops = self._commit_ops(ex, docs, carry_new, release, replay, now)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    # user code's errors are caught inside replay: what escapes is a document
                    # the engine cannot make sense of
                    self.fail_corrupt(execution_id, CorruptDocument(f"malformed document in {execution_id!r}: {exc!r}"))
                    return "failed"
                if ops is None:
                    return "noop"
                try:
                    with span("commit", execution_id=execution_id, ops=len(ops), outcome=replay.kind):
                        self._apply(execution_id, ops, replay, orphan_sends)
                except ConflictError:
                    conflicts += 1
                    eng.counters.incr("drive_conflict")
                    continue
                log.debug(
                    "drive %s: %s after %d steps (%d new documents, %d sends)",
                    execution_id,
                    replay.kind,
                    replay.steps,
                    len(ops) - 1,
                    len(replay.sends),
                    extra={"workflow_id": execution_id, "workflow": ex.get("workflow"), "step": replay.steps},
                )
                for req in replay.sends:
                    orphan_sends[req.key] = req
                self._after_commit(ex, replay)
                return replay.kind
            log.error("drive %s: gave up after %d rounds of contention", execution_id, MAX_ROUNDS)
            return "contended"
        finally:
            for req in orphan_sends.values():
                eng.dispatch(req)

    def fail_corrupt(self, execution_id: str, error: Exception) -> None:
        """Mark an execution whose documents cannot be read as failed, with a clear error.

        Its other documents are left as they are (for inspection); the execution leaves every
        scan, so recovery keeps running for everyone else.
        """
        eng = self.engine
        store = eng.store
        log.error("execution %s failed: %s", execution_id, error)
        info = error_info(error)
        fields = {
            "status": FAILED,
            "error": info,
            "lease": None,
            "due_kind": None,
            "due_at": None,
            "completed_at": eng.clock.now(),
        }
        for _ in range(10):
            try:
                ex = store.read(execution_id, EXEC_ID)
            except CorruptDocument:
                ex = None
            try:
                if ex is not None and isinstance(ex.get("workflow"), str):
                    store.replace(strip_reserved(ex) | fields, if_match=ex["_etag"])
                else:
                    store.upsert({"pk": execution_id, "id": EXEC_ID, "type": "exec", "workflow": "?"} | fields)
                break
            except ConflictError:
                continue
        eng.cache.invalidate(execution_id)
        eng.emit("workflow_failed", execution_id=execution_id, workflow="?")

    def _commit_ops(
        self, ex: Doc, docs: dict[str, Doc], carry_new: list[Doc], release: list[int], replay: Replay, now: float
    ) -> list[Op] | None:
        eng = self.engine
        run = int(ex.get("run") or 0)
        ops: list[Op] = [Op.create(d) for d in carry_new]
        ops += [Op.create(d) for d in replay.new_docs if d["id"] not in docs]
        for seq in release:
            marker = docs.get(marker_id(seq, run))
            if marker is not None and (marker.get("lease") or marker.get("due_kind")):
                cleared = settled(marker)
                ops.append(Op.replace(cleared, marker["_etag"]))
        new_ex = strip_reserved(ex)
        steps = max(replay.steps, int(ex.get("steps") or 0))
        new_ex.update(lease=None, due_kind=None, due_at=None, last_error=None, steps=steps)
        if replay.kind == "unknown":
            known = ", ".join(sorted(eng.registry.workflows)) or "none"
            new_ex.update(
                last_error=f"workflow {ex['workflow']!r} is not registered in this worker (registered: {known}); "
                "it will be retried",
                due_kind=DUE_EXEC,
                due_at=now + eng.settings.unknown_retry_delay,
            )
            log.error("execution %s: %s", ex["pk"], new_ex["last_error"])
        elif replay.kind == "continued":
            # a fresh run with a fresh history; the old run's documents are deleted after commit
            new_ex.update(
                status=RUNNING,
                run=run + 1,
                payload=replay.payload,
                steps=0,
                continued=int(ex.get("continued") or 0) + 1,
                due_kind=DUE_EXEC,
                due_at=now + eng.settings.drive_timeout,
            )
        elif replay.kind in ("completed", "failed", "cancelled"):
            status = {"completed": COMPLETED, "failed": FAILED, "cancelled": CANCELLED}[replay.kind]
            new_ex.update(status=status, completed_at=now)
            if replay.kind == "completed":
                new_ex["result"] = replay.value
            else:
                new_ex["error"] = replay.error
            if ex.get("parent"):
                # stays due until the parent has been told (recovery retries a lost notice)
                new_ex.update(parent_notified=False, due_kind=DUE_EXEC, due_at=now + eng.settings.drive_timeout)
        idle = replay.kind == "suspended" and not ops and not replay.sends
        if idle and not ex.get("lease") and not ex.get("due_kind") and not ex.get("last_error"):
            return None  # nothing new: a duplicate drive message
        new_ex["updated_at"] = now
        new_ex["drives"] = int(ex.get("drives") or 0) + 1
        ops.append(Op.replace(new_ex, ex["_etag"]))
        return ops

    def _apply(self, pk: str, ops: list[Op], replay: Replay, orphan_sends: dict[str, Send]) -> None:
        store = self.engine.store
        limit = store.max_batch_ops
        if len(ops) > limit:
            # Too many for one transactional batch (a wide fan-out): create the overflow first.
            # They are create-only, so a retry after a conflict finds them recorded; their
            # messages must then still be sent, whatever happens to this drive.
            overflow, ops = ops[: len(ops) - limit], ops[len(ops) - limit :]
            for op in overflow:
                assert op.doc is not None and op.kind == "create"
                store.create(op.doc)
            for req in replay.sends:
                orphan_sends[req.key] = req
        store.batch(pk, ops)

    def _record(self, docs: list[Doc]) -> None:
        for d in docs:
            self.engine.store.create(d)

    def _release_each(self, docs: dict[str, Doc], release: list[int]) -> None:
        run = int((docs.get(EXEC_ID) or {}).get("run") or 0)
        for seq in release:
            marker = docs.get(marker_id(seq, run))
            if marker is not None and (marker.get("lease") or marker.get("due_kind")):
                try:
                    cleared = settled(marker)
                    self.engine.store.replace(cleared, if_match=marker["_etag"])
                except ConflictError:
                    pass  # the recovery scan clears a marker whose result exists

    def _after_commit(self, ex: Doc, replay: Replay) -> None:
        eng = self.engine
        eng.emit("drive_committed", execution_id=ex["pk"], outcome=replay.kind)
        if replay.kind in ("completed", "failed", "cancelled"):
            eng.emit(f"workflow_{replay.kind}", execution_id=ex["pk"], workflow=ex["workflow"])
            if ex.get("parent"):
                eng.links.notify_parent(ex["pk"])
        elif replay.kind == "suspended":
            eng.emit("workflow_suspended", execution_id=ex["pk"], workflow=ex["workflow"])
        elif replay.kind == "continued":
            eng.emit("workflow_continued", execution_id=ex["pk"], workflow=ex["workflow"])
            eng.links.prune_run(ex["pk"], int(ex.get("run") or 0))
            eng.dispatcher.send_drive(ex["pk"])
