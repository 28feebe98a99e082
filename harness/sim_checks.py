"""End-of-run invariant checks of the deterministic simulation (:mod:`harness.sim`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from celery_durable.engine.documents.checks import pending_signal_values
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.stores.base import Doc
from harness.sim_batch import TERMINATED_OUTCOME, check_batches, terminated
from harness.sim_deadlines import TIMED_OUT, check_ended
from harness.sim_limits import check_settled
from harness.sim_pause import check_unpaused
from harness.sim_store import EPOCH, Planned, Sim
from harness.sim_updates import check_updates

__all__ = ["Outcome", "check", "outcome_of"]

Outcome = tuple[Any, ...]


def outcome_of(ex: Doc) -> Outcome:
    status = ex.get("status")
    if status == "completed":
        return ("completed", json.dumps(ex.get("result"), sort_keys=True))
    if status == "failed":
        return ("failed", (ex.get("error") or {}).get("type"))
    return (str(getattr(status, "value", status)),)


def check(self: Sim, reference: Callable[[str, list[Any]], Outcome]) -> None:
    """Invariants 1, 5 and 6 at the end of a run (2, 3, 4 and 7 are checked as writes happen)."""
    check_settled(self)  # invariant 13 (c): no limit waits with room (sim_limits.py)
    check_unpaused(self)  # invariant 14 (d): none left paused (sim_pause.py)
    check_updates(self)  # invariant 15: updates applied once, rejected ones recorded nowhere (sim_updates.py)
    check_batches(self)  # invariant 16: batches act once on what they select (sim_batch.py)
    ended = terminated(self)  # by a batch
    execs = self._execs()
    orphaned: dict[str, str] = {}  # stranded execution -> open bug whose signature it has
    for pk, ex in execs.items():
        if ex.get("status") not in TERMINAL:
            fields = {k: ex.get(k) for k in ("status", "run", "steps", "cancel_requested", "due_kind", "due_at")}
            late = _outcomes_after(self, pk, ex)
            if late:
                orphaned[pk] = "record_before_claim"
                fields["outcomes written after the exec"] = late
            self.violate(5, f"{pk} left {fields} (now {self.now - EPOCH:.0f})", orphaned.get(pk))
    for pk, ex in execs.items():
        if isinstance(ex.get("pending_op"), dict):
            self.violate(8, f"{pk}: an operation was left pending after healing: {ex['pending_op'].get('kind')}")
    for p in self.plan:
        found = execs.get(p.eid)
        if found is None:
            self.violate(5, f"{p.eid} was never created (start kept failing?)")
            continue
        got = outcome_of(found)
        if p.workflow == "w_signal":
            _check_signals(self, p, found, got, orphaned.get(p.eid))
            continue
        expected = reference(p.workflow, p.args)
        allowed = [expected] + ([("cancelled",)] if p.cancel_sent else [])
        allowed += [TERMINATED_OUTCOME] if p.eid in ended else []
        if p.timing is not None:  # a deadline, a delayed start (sim_deadlines.py)
            allowed += [TIMED_OUT] if p.timing.timeout is not None else []
            check_ended(self, p, found)
        if got not in allowed:
            message = f"{p.eid} ended {got}; a fault-free run ends {expected} (cancel sent: {p.cancel_sent})"
            self.violate(1, message, orphaned.get(p.eid))
        if p.workflow == "w_saga" and got in (("cancelled",), TIMED_OUT):
            _check_compensated(self, p.eid)


def _outcomes_after(self: Sim, pk: str, ex: Doc) -> list[str]:
    """Outcome documents written after the exec's last write (the store's etags are its write
    sequence): recorded, but no drive or bump ever followed."""
    try:
        last = int(ex["_etag"])
        return [
            str(d["id"])
            for d in self.inner.query_partition(pk).docs
            if d.get("type") in ("result", "signal", "signal_value") and int(d["_etag"]) > last
        ]
    except (KeyError, ValueError):  # a store whose etags are not a sequence
        return []


def _check_signals(self: Sim, p: Planned, ex: Doc, got: Outcome, bug: str | None) -> None:
    """Channel semantics: each wait consumes the next value sent (arrival order), once; values no
    wait consumed stay pending in the store; none is lost, invented or consumed out of order."""
    if got[0] != "completed":
        self.violate(1, f"{p.eid} ended {got}; a signal workflow always completes", bug)
        return
    seen = [v for v in ex.get("result") or [] if v is not None]
    docs = {d["id"]: d for d in self.inner.query_partition(p.eid).docs}
    pending = [d.get("value") for d in pending_signal_values(docs, "tick")]
    lost = [t for t in p.accepted if t not in seen and t not in pending]
    if lost:
        self.violate(6, f"{p.eid}: signals {lost} were accepted but neither seen nor pending (saw {ex.get('result')})")
    invented = [t for t in seen if t not in p.accepted and t not in p.uncertain]
    if invented:
        self.violate(1, f"{p.eid}: saw {invented}, which no accepted signal() call sent")
    twice = sorted({t for t in seen if seen.count(t) > 1 and t not in p.doubtful})
    if twice:
        self.violate(1, f"{p.eid}: consumed {twice} more than once (saw {ex.get('result')})")
    # sent once each, in this order (a sequential client): the waits take a prefix of them, in order
    sent = [t for t in p.accepted if t not in p.doubtful]
    taken = [t for t in seen if t in sent]
    if taken != sent[: len(taken)]:
        self.violate(1, f"{p.eid}: values consumed out of order: took {taken} of {sent}")
    if len(ex.get("result") or []) != p.args[0]:
        self.violate(1, f"{p.eid}: {p.args[0]} rounds but the result is {ex.get('result')}")


def _check_compensated(self: Sim, eid: str) -> None:
    docs = {d["id"]: d for d in self.inner.query_partition(eid).docs}
    done = {"reserve": 0, "release": 0}
    for d in docs.values():
        if d.get("type") == "step" and d.get("name") in done:
            r = docs.get(f"r:{int(d['seq']):06d}")
            if r is not None and r.get("ok"):
                done[str(d["name"])] += 1
    if done["reserve"] != done["release"]:
        self.violate(1, f"{eid} cancelled with {done['reserve']} reservations and {done['release']} releases")
