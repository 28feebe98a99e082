"""Workflow updates in the deterministic simulation (engine/replay/updates.py, issue 27 §4).

On two seeds in five (``seed % 5 in (2, 4)``; the other seeds run exactly as before: nothing is
drawn from their rng here) one or two ``w_update`` executions run (some continue as new once, so
requests race continue-as-new), and the client sends them 2 to 5 update requests each within 80
steps of its start: ``add(token, amount)``, one in three with a negative amount (its
validator rejects it). The client's store calls are faulted like any other (a send whose write
applied may raise: it is sent again with the same ``update_id``, so it is recorded once). Its
choices use an rng of its own (``update:<seed>``). The second execution, if any, is started by an
update-with-start (its first request created with it, in one batch; resent with its
``update_id`` after a raise).

Invariant 15, checked after healing on the documents as stored:
(a) no request is lost: every request a send returned is stored, with an outcome (accepted or
    rejected) unless its execution ended without handling it (refused: it ran no wait point
    after the request); no token is recorded twice;
(b) only invalid requests are rejected, every invalid one is, and a rejected one is in no history
    (no ``update`` step names it);
(c) an accepted one is a step of its run (``update`` marker naming it); per run, the answers are
    1, 2, ... in step order (applied once each), and a read-only replay of the ended execution
    (a query) rebuilds exactly the tokens its last run accepted, in step order.
"""

from __future__ import annotations

import random
from typing import Any

from celery_durable.engine.documents.model import EXEC_ID, TERMINAL
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.documents.update_docs import UPDATE_OUTCOME_PREFIX, UPDATE_REQUEST_PREFIX
from celery_durable.engine.replay.queries import answer_query
from celery_durable.engine.starts import with_start
from celery_durable.errors import UpdateRefusedError
from harness.sim_store import SETTINGS, Planned, SimClock

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module's importer)
Sim = Any

__all__ = ["updating", "plan_updates", "check_updates"]


def updating(seed: int) -> bool:
    """Whether the seed runs workflows that take updates."""
    return seed % 5 in (2, 4)


class _Send:
    """One client's update request (an op of the plan, postponed until its execution started)."""

    def __init__(self, sim: Sim, p: Planned, token: str, amount: int) -> None:
        self.sim, self.p, self.token, self.amount = sim, p, token, amount
        self.eid = p.eid

    def __call__(self) -> None:
        from harness.sim import _NotStarted  # the scheduler's: it imports this module's importer

        if not self.p.started:
            raise _NotStarted
        log = self.sim.update_log.setdefault(self.eid, {})
        try:
            n = self.sim.client.engine.updates.send(self.eid, "add", (self.token, self.amount), update_id=self.token)
        except UpdateRefusedError:
            log[self.token] = (self.amount, None)  # it had ended: refused at once
            self.sim.count("update_refused")
            return
        log[self.token] = (self.amount, n)
        self.sim.count("update_sent")


def plan_updates(sim: Sim) -> None:
    sim.update_log = {}
    if sim.reference or not updating(sim.seed):
        return
    rng = random.Random(f"update:{sim.seed}")
    for i in range(rng.randint(1, 2)):
        p = Planned(f"s{sim.seed}-u{i}-w_update", "w_update", [rng.randint(2, 4), rng.choice([1, 2])])
        sim.plan.append(p)
        start = rng.randint(0, 60)
        with_start = i == 1  # the second starts with its first request: update-with-start
        sim._op(start, _ClientStart(sim, p, f"{p.eid}#s" if with_start else None))
        for j in range(rng.randint(2, 5)):
            amount = -1 if rng.random() < 1 / 3 else rng.randint(0, 9)
            sim._op(rng.randint(start, start + 80), _Send(sim, p, f"{p.eid}#{j}", amount))


class _ClientStart:
    """The start, or an update-with-start with request ``token`` (amount 1), resent with its
    ``update_id`` after a raise."""

    def __init__(self, sim: Sim, p: Planned, token: str | None) -> None:
        self.sim, self.p, self.eid, self.token = sim, p, p.eid, token

    def __call__(self) -> None:
        sim, p = self.sim, self.p
        if self.token is None:
            sim._start(p)
            return
        definition = sim.registry.workflow(p.workflow)
        call: tuple[tuple[Any, ...], dict[str, Any]] = (tuple(p.args), {})
        n, _ = with_start.update_with_start(
            sim.client.engine, definition, p.eid, "add", (self.token, 1), call, {}, update_id=self.token
        )
        p.started = True
        sim.update_log.setdefault(p.eid, {})[self.token] = (1, n)
        sim.count("update_with_start")


def check_updates(sim: Sim) -> None:
    for eid, sent in sim.update_log.items():
        _check(sim, eid, sent)


def _check(sim: Sim, eid: str, sent: dict[str, tuple[int, int | None]]) -> None:
    docs = {d["id"]: d for d in sim.inner.query_partition(eid).docs}
    ex = docs.get(EXEC_ID)
    if ex is None:
        return  # never created: invariant 5 says so
    requests = {int(d["n"]): d for i, d in docs.items() if i.startswith(UPDATE_REQUEST_PREFIX)}
    outcomes = {int(d["n"]): d for i, d in docs.items() if i.startswith(UPDATE_OUTCOME_PREFIX)}
    tokens = [str(r["input"]["args"][0]) for r in requests.values()]
    if len(tokens) != len(set(tokens)):
        sim.violate(15, f"{eid}: a token was recorded twice: {sorted(tokens)}")
    for token, (_amount, n) in sent.items():
        if n is not None and n not in requests:
            sim.violate(15, f"{eid}: request {n} ({token}) was sent but is not stored")
    run = int(ex.get("run") or 0)
    updates = {
        int(d["request"]): d
        for d in docs.values()
        if d.get("type") == "step" and d.get("kind") == StepKind.UPDATE and int(d.get("run") or 0) == run
    }
    for n, request in sorted(requests.items()):
        token, amount = request["input"]["args"]
        outcome = outcomes.get(n)
        if outcome is None:
            if ex.get("status") not in TERMINAL:
                sim.violate(15, f"{eid}: request {n} ({token}) undecided and the execution still {ex.get('status')}")
            else:
                sim.count("update_refused_at_end")
            continue
        sim.count("update_accepted" if outcome.get("accepted") else "update_rejected")
        if bool(outcome.get("accepted")) != (amount >= 0):
            sim.violate(15, f"{eid}: request {n} ({token}, amount {amount}) accepted={outcome.get('accepted')}")
        if not outcome.get("accepted") and n in updates:
            sim.violate(15, f"{eid}: rejected request {n} ({token}) is step {updates[n]['seq']} of the history")
        if outcome.get("accepted") and int(outcome.get("run") or 0) == run:
            marker = updates.get(n)
            if marker is None or marker.get("seq") != outcome.get("seq"):
                sim.violate(15, f"{eid}: accepted request {n} ({token}) is not step {outcome.get('seq')} of run {run}")
    by_run: dict[int, list[dict[str, Any]]] = {}
    for outcome in outcomes.values():
        if outcome.get("accepted"):
            by_run.setdefault(int(outcome.get("run") or 0), []).append(outcome)
    for r, accepted in by_run.items():
        accepted.sort(key=lambda o: int(o["seq"]))
        answers = [o.get("value") for o in accepted]
        if answers != list(range(1, len(accepted) + 1)):
            sim.violate(15, f"{eid}: run {r} answered {answers} to its accepted updates, in step order")
    if ex.get("status") == "completed":
        expected = [str(requests[int(o["n"])]["input"]["args"][0]) for o in by_run.get(run, [])]
        got = answer_query(sim.inner, sim.registry, SETTINGS, SimClock(sim, 0.0), eid, "seen", ())
        if got != expected:
            sim.violate(15, f"{eid}: a replay of run {run} rebuilds {got}, its accepted updates are {expected}")
        sim.count("update_checked")
