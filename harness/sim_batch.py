"""Batch operations in the deterministic simulation (engine/admin/batch.py, glue/batch.py).

On one seed in three (``seed % 3 == 2``; no other seed draws here) a client starts one or two
batches as the library runs them: the real ``celery_durable.batch`` workflow (glue/batch.py),
checked by ``batch_spec``, its pages the real ``celery_durable.batch.page`` activity
(``apply_page``) run by the simulated workers like any other step, so a page's attempt meets every
fault the sim injects: store errors before and after a write (the page is retried: its activity's
autoretry), its worker dying in the middle of the page, its message lost, duplicated or delayed,
another attempt taking it over once its lease lapsed, preemption inside each of its store calls.
Each batch is one of:

- ``cancel`` or ``terminate`` of the running executions of one workflow of the plan (not
  ``w_signal``, whose check wants it completed; children are never selected: ``w_child`` only
  runs as one);
- ``signal``: the value ``batch<i>`` on ``tick`` to every running ``w_signal``;
- ``retry`` of the failed executions of one workflow (``w_fail`` when planned), ``resume`` of the
  cancelled ones (never ``w_seq``: the keyed starts' workflow; reopened, a superseded holder runs
  beside the key's newer one, as docs/guides/dedup.md says);

page by page (1-3 executions a page), sometimes with a rate (the batch then sleeps between
pages). When it starts, a batch other than a signal takes the workflow with the most executions
in its query's status; the start is put off while the query selects nothing (a retry before
anything failed). Its choices use an rng of its own (``batch:<seed>``).

Invariant 16 (its watch sees every write unit of the store, in order: sim_pause_watch.py):
(a) no execution carries two records of one batch (``<by>@batch:<id>``), and a batch's signal
value is in the execution's history (consumed or pending) once if recorded, never if not;
(b) every record is on an execution of the query's workflow (never the batch itself; a child its
terminate ended is the cascade's), of the batch's action, and found the execution in the query's
status (unless someone else changed that status while the batch ran: listed, then changed);
(c) every execution in the query's status when the batch was created that stayed in it until the
batch acted on it, or until the batch ended, carries a record or is named among the batch's
refusals by its action (a resume while a step still runs): nothing eligible is skipped;
(d) the batch ends (invariant 5 too), completed, its totals with ``matched == done + refused`` and
``done`` at most the executions it recorded; equal when no page ran twice;
and every other invariant holds with it (1: an execution the batch cancelled or terminated may end
so; 6: its signal is not lost).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import celery_durable.glue.batch  # noqa: F401 - declares the batch workflow and its page activity
from celery_durable.engine.admin.batch import BATCH_WORKFLOW, batch_spec
from celery_durable.engine.admin.terminate import TERMINATED
from celery_durable.engine.documents.checks import pending_signal_values
from celery_durable.engine.documents.model import EXEC_ID, TERMINAL
from celery_durable.stores.base import Doc

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module's importer)
Sim = Any

__all__ = [
    "BATCH_ACTIONS",
    "BY",
    "TERMINATED_OUTCOME",
    "Batch",
    "BatchWatch",
    "batching",
    "check_batches",
    "plan_batches",
    "terminated",
]

BATCH_ACTIONS = ("cancel", "terminate", "signal", "retry", "resume")
BY = "sim-batch"
#: the outcome of a terminated execution (sim_checks.outcome_of)
TERMINATED_OUTCOME = ("failed", TERMINATED)
#: workflows a cancel or a terminate never selects (w_signal must complete; w_child is a child)
NOT_ENDED = ("w_signal", "w_child")
#: and a retry or a resume: w_seq runs the keyed starts (sim_dedup.py), and a reopened execution
#: does not take its key back, it runs beside a newer holder (docs/guides/dedup.md: not invariant 10)
NOT_REOPENED = (*NOT_ENDED, "w_seq")


def batching(seed: int) -> bool:
    """Whether the seed runs batch operations."""
    return seed % 3 == 2


@dataclass
class Batch:
    """One batch: its execution, its query, and what the watch saw of it."""

    eid: str
    action: str
    workflow: str
    status: str
    token: str
    open: bool = False  # created and not ended
    created: bool = False
    #: executions in the query's status at its creation that have not left it before the batch acted
    eligible: set[str] = field(default_factory=set)
    #: per execution: the records of this batch created (operation documents ``by`` it)
    records: Counter[str] = field(default_factory=Counter)
    ops: list[Doc] = field(default_factory=list)
    #: executions whose status changed while it ran, not by it (listed in one status, found in another)
    moved: set[str] = field(default_factory=set)
    tried: bool = False  # its start was tried (its query is fixed from then on)
    late: int = 0  # records written after the batch ended

    @property
    def actor(self) -> str:
        return f"{BY}@batch:{self.eid}"


class BatchWatch:
    """Every write unit of the store (sim_pause_watch.PauseWatch calls it), for invariant 16."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.batches: dict[str, Batch] = {}
        self.execs: dict[str, tuple[str, str]] = {}  # pk -> (workflow, status) as last written
        self.parents: dict[str, str] = {}  # child pk -> its parent's (a reset may delete the child)

    def unit(self, pk: str, unit: list[tuple[Doc, bool]]) -> None:
        new = next((d for d, _ in unit if d.get("id") == EXEC_ID), None)
        ops = [d for d, created in unit if created and d.get("type") == "operation"]
        for b in self.batches.values():
            mine = [d for d in ops if d.get("by") == b.actor]
            if mine:
                b.records[pk] += len(mine)
                b.ops += [d | {"pk": pk} for d in mine]
                b.late += 0 if b.open else len(mine)
            moved = new is not None and str(new.get("status")) != self.execs.get(pk, ("", ""))[1]
            if b.open and moved and not mine:
                b.moved.add(pk)  # its status changed while the batch ran (not by the batch)
            if b.open and pk in b.eligible and not mine and new is not None and new.get("status") != b.status:
                b.eligible.discard(pk)  # it left the query's status before the batch acted on it
        if new is None:
            return
        self.execs[pk] = (str(new.get("workflow")), str(new.get("status")))
        if isinstance(new.get("parent"), dict):
            self.parents[pk] = str(new["parent"].get("pk"))
        own = self.batches.get(pk)  # the batch's own execution: its creation, its end
        if own is not None and not own.created:
            own.created = own.open = True
            own.eligible = {p for p, (w, s) in self.execs.items() if w == own.workflow and s == own.status}
        if own is not None and new.get("status") in TERMINAL:
            own.open = False


def plan_batches(sim: Sim) -> None:
    if sim.reference or not batching(sim.seed):
        return
    rng = random.Random(f"batch:{sim.seed}")
    watch = BatchWatch(sim)
    sim.batch_watch = watch
    sim.store.pauses.also.append(watch.unit)
    kinds = sorted({p.workflow for p in sim.plan})
    for i in range(rng.randint(1, 2)):
        action = rng.choice(BATCH_ACTIONS)
        if action == "signal":
            workflow, status = "w_signal", "running"
        elif action == "retry":
            workflow, status = (
                ("w_fail" if "w_fail" in kinds else rng.choice([k for k in kinds if k not in NOT_REOPENED])),
                "failed",
            )
        elif action == "resume":
            workflow, status = rng.choice([k for k in kinds if k not in NOT_REOPENED]), "cancelled"
        else:
            workflow, status = rng.choice([k for k in kinds if k not in NOT_ENDED]), "running"
        b = Batch(f"s{sim.seed}-b{i}-{action}", action, workflow, status, f"batch{i}")
        watch.batches[b.eid] = b
        late = action in ("retry", "resume")  # after something failed or was cancelled
        sim._op(rng.randint(60, 190) if late else rng.randint(5, 150), _Start(sim, b, rng))


class _Start:
    """The client starts the batch (``durable batch ACTION ...``); ``eid`` lets preemption pick it."""

    def __init__(self, sim: Sim, b: Batch, rng: random.Random, tries: int = 8) -> None:
        self.sim, self.b, self.rng, self.tries, self.eid = sim, b, rng, tries, b.eid

    def __call__(self) -> None:
        sim, b, rng = self.sim, self.b, self.rng
        skip = (*(NOT_REOPENED if b.action in ("retry", "resume") else NOT_ENDED), BATCH_WORKFLOW)
        now = Counter(w for w, s in sim.batch_watch.execs.values() if s == b.status and w not in skip)
        if b.action != "signal" and now and not b.tried:  # the workflow with the most in the query's status
            b.workflow = max(sorted(now), key=lambda w: (now[w], rng.random()))
        if self.tries > 1 and not any(w == b.workflow and s == b.status for w, s in sim.batch_watch.execs.values()):
            sim._op(sim.step + rng.randint(5, 30), _Start(sim, b, rng, self.tries - 1))
            return
        rate = rng.choice([None, None, None, 1.0, 2.0])
        query, options = batch_spec(
            b.action,
            b.workflow,
            b.status,
            by=BY,
            reason=f"seed {sim.seed}",
            signal="tick" if b.action == "signal" else None,
            value=b.token if b.action == "signal" else None,
            rate=rate,
            page_size=rng.randint(1, 3),
        )
        definition = sim.registry.workflow(BATCH_WORKFLOW)
        b.tried = True  # a start that raises may have applied: tried again (sim._client_op) as it is
        sim.client.engine.start(definition, (b.action, query, options), {}, workflow_id=b.eid)
        sim.count(f"batch_{b.action}_started")


def check_batches(sim: Sim) -> None:
    """Invariant 16 after healing; lets invariants 1 and 6 allow what the batches did."""
    watch: BatchWatch | None = getattr(sim, "batch_watch", None)
    if watch is None:
        return
    plan = {p.eid: p for p in sim.plan}
    for b in watch.batches.values():
        if not b.created:
            continue
        for pk, n in b.records.items():
            if n > 1:
                sim.violate(16, f"{b.eid} acted on {pk} {n} times")
            p = plan.get(pk)
            if p is not None and b.action == "cancel":
                p.cancel_sent = True
        cascaded = {pk for pk in b.records if b.action == "terminate" and watch.parents.get(pk) in b.records}
        for op in b.ops:
            workflow = watch.execs.get(op["pk"], ("?", "?"))[0]
            if op["pk"] in cascaded:
                continue  # a terminate ends the running children too (engine/admin/terminate.py)
            status = b.status if op["pk"] in b.moved else op.get("status")  # listed, then it changed
            if op["pk"] == b.eid or (workflow, op.get("action"), status) != (b.workflow, b.action, b.status):
                what = f"{op['pk']} ({workflow}): {op.get('action')} of a {op.get('status')} execution"
                sim.violate(16, f"{b.eid} ({b.action} {b.workflow} {b.status}) acted outside its query: {what}")
        refused = dict(_totals(sim, b).get("errors") or [])
        for why in refused.values():
            sim.count(f"batch_refused {why.split(':')[0]}")
        # refused by the action (a resume while a step still runs): named in the batch's errors
        missed = sorted(pk for pk in b.eligible if not b.records.get(pk) and _not_refused(refused.get(pk)))
        if missed:
            sim.violate(16, f"{b.eid} skipped {missed}: in its query from its start until it acted or ended")
        _check_totals(sim, b, len(b.records) - len(cascaded))  # (d)
        if b.action == "signal":
            _check_signal(sim, b, plan)
        sim.count(f"batch_{b.action}_acted", len(b.records))
        sim.count("batch_page_twice", _pages_run_twice(sim, b.eid))
        sim.count("batch_records_late", b.late)


def terminated(sim: Sim) -> set[str]:
    """The executions a batch terminated (invariant 1 allows them to end so)."""
    watch: BatchWatch | None = getattr(sim, "batch_watch", None)
    batches = watch.batches.values() if watch is not None else ()
    return {pk for b in batches if b.action == "terminate" for pk in b.records}


def _not_refused(why: str | None) -> bool:
    """Whether ``why`` is no refusal by the action (an eligible execution is not to be refused for
    anything else: not "nothing to do", nor an error that is not the action's refusal)."""
    return why is None or not why.startswith("OperationRefused:")


def _totals(sim: Sim, b: Batch) -> dict[str, Any]:
    ex = sim.inner.read(b.eid, EXEC_ID) or {}
    t = ex.get("result") if ex.get("status") == "completed" else None
    return t if isinstance(t, dict) else {}


def _check_totals(sim: Sim, b: Batch, acted: int) -> None:
    ex = sim.inner.read(b.eid, EXEC_ID) or {}
    t = ex.get("result") if ex.get("status") == "completed" else None
    if not isinstance(t, dict) or not isinstance(t.get("done"), int):
        sim.violate(16, f"{b.eid} did not finish: {ex.get('status')} {ex.get('result') or ex.get('error')}")
        return
    twice = _pages_run_twice(sim, b.eid)
    sim.count("batch_done_short", max(0, acted - int(t["done"])))  # a page run again lists fewer
    if t["matched"] != t["done"] + t["refused"] or t["done"] > acted or (not twice and t["done"] != acted):
        counts = {k: t[k] for k in ("matched", "done", "refused", "pages")}
        sim.violate(16, f"{b.eid} reported {counts}; {acted} executions carry its record (a page ran twice: {twice})")


def _pages_run_twice(sim: Sim, eid: str) -> bool:
    """Whether an attempt of one of the batch's pages began after another (a retry, a takeover)."""
    docs = sim.inner.query_partition(eid).docs
    return any(d.get("type") == "step" and int(d.get("attempts") or 0) > 1 for d in docs)


def _check_signal(sim: Sim, b: Batch, plan: dict[str, Any]) -> None:
    """The batch's value is in each execution's history once if the batch recorded it, never if not
    (consumed: in the result; pending: a value no wait took)."""
    for pk, (workflow, _) in sorted(sim.batch_watch.execs.items()):
        if workflow != "w_signal":
            continue
        docs = {d["id"]: d for d in sim.inner.query_partition(pk).docs}
        ex = docs.get(EXEC_ID) or {}
        seen = [v for v in ex.get("result") or [] if v == b.token]
        pending = [v for v in pending_signal_values(docs, "tick") if v.get("value") == b.token]
        found, recorded = len(seen) + len(pending), b.records.get(pk, 0)
        if found != min(recorded, 1):
            sim.violate(16, f"{pk}: {b.eid}'s value is in its history {found} times; the batch recorded {recorded}")
        p = plan.get(pk)
        if p is not None and recorded:  # accepted (the order and the twice checks are this one's)
            p.accepted.append(b.token)
            p.doubtful.append(b.token)
