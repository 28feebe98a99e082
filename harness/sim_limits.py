"""Keyed concurrency and rate limits in the deterministic simulation (issue 26 §1, engine/limits/).

On one seed in three (``seed % 3 == 1``: the other seeds run as they did before limits, no draw of
the seed's rng here) the plan adds fan-outs of ``charge`` (``Limit("sim.charge", max_running=2)``
keyed by 1-3 keys shared by the seed's workflows, every third failing once: a retry gives its
slot back and takes one again) and of ``ping`` (``Limit("sim.ping", rate="3/m")``), some
cancelled (a waiting step of a cancelled workflow is granted, then gives its slot straight back).
They run through every fault of the simulation: crashes of slot holders and of releasers between
their write and their sends, lost, duplicated and delayed messages, store errors, preemption in
the middle of a limit document's read-modify-write (the preempting action prefers work that
enters or leaves a slot, :func:`limit_work`), skewed clocks, and lapsed slots granted by the
recovery scan (the healing phase jumps to a limit document's due time as to any other).

Invariant 13 (sim_catalog.INVARIANTS):

(a) *slots*, checked as each attempt begins (:func:`check_begun`): of the attempts in flight
    (``sim.inflight``) whose step records the same limit and key, those holding their step's lease
    (the marker's ``lease.holder`` is theirs and ``lease.expires > now + SKEW``) are at most
    ``max_running``. ``SKEW``: a slot is freed once its step's lease has lapsed *on the freeing
    worker's clock*, which may run up to 0.8 s ahead of another's, so a lease within ``SKEW`` of
    its expiry is not counted.
(b) *rate*, checked as each attempt begins (:func:`check_begun`): the true time (``sim.now``) of
    every begin of an attempt of a rate-limited step is recorded per limit document, and no window
    shorter than the rate's period by ``2 * MAX_SKEW`` holds more than its count of them (the
    engine counts an attempt's real start: a grant's entry moves to its begin, and another attempt
    of a step holding its slot is another start). True time, not the stored ``starts`` (each
    written on its writer's skewed clock): with clocks ``MAX_SKEW`` either side of true time, a
    writer may find a start out of the window ``2 * MAX_SKEW`` early, so exactness is impossible
    and that is the tolerance. (It found a grant begun a period or more late starting without a
    rate check; fixed: such a begin is a new start, room allowing, else it queues.)
(a') *freed*, on every write of a limit document with ``max_running`` (:class:`LimitWatch`): a
    step that leaves the holders has no attempt in flight still holding its lease (beyond ``SKEW``).
(c) *liveness*, at the end (:func:`check_settled`): once healing is over, time jumps past every
    limit document's due time, holder expiry and rate window, and one fault-free limit scan
    runs; then no limit document has waiters while it has room. (A workflow left waiting for a
    slot nobody grants is invariant 5's: the healing phase only ends when every execution has.)

Limits on whole executions (engine/limits/workflows.py; the plan, the workflow and the checks are
in harness/sim_wf_limits.py). On one seed in six (``seed % 6 == 4``: a subset of the seeds above,
which draw for it after their fan-outs; no other seed draws) the plan adds 3-7 executions of
``w_tenant`` (``Limit("sim.tenant", max_running=2)`` keyed by its first argument, over 1-3 keys)
started in a burst (so keys fill and executions queue): about half with a priority (-1, 0, 1 or
5), some with a ``limit_key`` of their own, some delayed (``start_delay``: ``scheduled``, then
queued at their time), about a third cancelled (soon after the start: often while ``queued``, or
later: often while running); by mode each runs 0-2 activities then sleeps (holding its slot long),
fails (a ``doomed`` step), continues as new once (keeping its slot) or runs a ``charge`` (an
activity limit inside a workflow limit). They go through every fault above: crashes and store
errors anywhere (between an end's commit and its slot's release too: the slot is then freed by
the scan at its holder's expiry, counted ``wf_slot_freed_late``), lost, duplicated and delayed
drives, preemption, skewed clocks. No operator call targets them (an operator's re-run ``hold``s a
slot regardless of room, a documented override that may exceed ``max_running``).

(d) *executions*, on every write of an exec document with a ``limit`` record (seen by the faulty
    store; :class:`~harness.sim_wf_limits.WfWatch`): the executions whose last written exec
    document has the same limit document (name and key) and status ``running`` are at most its
    ``max_running``. Exact, no skew tolerance: an execution is made ``running`` only after a write
    granted its slot, and an end's terminal write comes before its slot is given back.
(d') on the same writes: an execution made ``running`` holds a slot in its limit document (as last
    written), and no write of a limit document frees the slot of an execution whose exec document
    is ``running``.
(e) *liveness*, after (c)'s fault-free scan (:func:`~harness.sim_wf_limits.check_wf_settled`): no
    execution with a ``limit`` record is left ``queued`` while its limit document has room or holds
    a slot for it (or is missing), and every planned ``w_tenant`` ended (completed, failed or
    cancelled, as invariant 1 then checks against a fault-free run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import EXEC_ID, marker_id
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import limit_pk
from celery_durable.engine.limits.table import room
from harness.sim_wf_limits import WfWatch, check_wf_settled, plan_wf_limited

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Attempt
    from celery_durable.stores.base import Doc

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module)
Sim = Any

__all__ = [
    "MAX_SKEW",
    "SKEW",
    "LimitWatch",
    "check_begun",
    "check_settled",
    "limit_work",
    "plan_limited",
]

#: the largest clock skew of a simulated worker either way (sim.Sim: uniform(-0.4, 0.4))
MAX_SKEW = 0.4
#: how far apart two workers' clocks may be, rounded up (as the lease check of invariant 4)
SKEW = 1.0
#: limited workflows planned per seed, at most
MAX_LIMITED, MAX_RATED = 3, 2
KEY_SETS = (["a"], ["a", "b"], ["a", "b"], ["a", "b", "c"])


def plan_limited(sim: Sim) -> None:
    """Plan the limited fan-outs of a seed with ``seed % 3 == 1``, then its limited executions."""
    if not sim.reference and sim.seed % 3 == 1:
        rng = sim.rng
        for n in range(rng.randint(2, MAX_LIMITED)):
            args: list[Any] = [rng.randint(4, 7), rng.choice(KEY_SETS), f"s{sim.seed}-l{n}"]
            sim._add(f"s{sim.seed}-l{n}-w_limited", "w_limited", args, cancel=rng.random() < 0.2, signals=0)
        for n in range(rng.randint(1, MAX_RATED)):
            args = [rng.randint(2, 4)]
            sim._add(f"s{sim.seed}-r{n}-w_rated", "w_rated", args, cancel=rng.random() < 0.2, signals=0)
    plan_wf_limited(sim)  # limited executions, on seed % 6 == 4 (sim_wf_limits.py)


def limit_work(sim: Sim, pk: str) -> list[str] | None:
    """Nested actions that touch limit document ``pk`` (a preemption in its read-modify-write):
    a delivery (an attempt enters), a finish (one leaves), a scan (lapsed slots granted)."""
    if not pk.startswith("lim:"):
        return None
    return ["deliver", "deliver", "finish", "finish", "recovery"]


def _record(sim: Sim, execution_id: str, seq: int, run: int) -> tuple[Doc | None, dict[str, Any] | None]:
    marker = sim.inner.read(execution_id, marker_id(seq, run))
    record = (marker or {}).get("limit")
    return marker, record if isinstance(record, dict) else None


def check_begun(sim: Sim, attempt: Attempt) -> None:
    """Invariant 13 (a) and (b), as ``attempt`` begins: at most ``max_running`` attempts of its key
    hold live leases; its start makes no window of its rate's period hold too many."""
    _, record = _record(sim, attempt.execution_id, attempt.seq, attempt.run)
    if record is None:
        return
    sim.count("limited_begun")
    lpk = limit_pk(record)
    rate = record.get("rate")
    if isinstance(rate, list) and len(rate) == 2:
        step = f"{attempt.execution_id}|{attempt.run}|{attempt.seq}"
        _check_rate(sim, lpk, int(rate[0]), float(rate[1]), step)
    if record.get("max") is None:
        return
    running = []
    for f in sim.inflight:
        a = f.attempt
        marker, other = _record(sim, a.execution_id, a.seq, a.run)
        if marker is None or other is None or limit_pk(other) != lpk:
            continue
        lease = marker.get("lease") or {}
        if lease.get("holder") == a.holder and float(lease.get("expires") or 0.0) > sim.now + SKEW:
            running.append(f"{a.execution_id}/{a.seq}#{a.number}")
    if len(running) > int(record["max"]):
        bug = None  # (it found an attempt whose lapsed lease a renewal revived without its slot: fixed)
        message = f"{lpk} ({record['name']} key {record['key']!r}): {len(running)} running at once: {running}"
        sim.violate(13, message, bug)


def _check_rate(sim: Sim, lpk: str, count: int, per: float, step: str) -> None:
    """(b) The begins of ``lpk``'s attempts (true time) in the window ending now: at most ``count``."""
    watch = sim.store.limits
    late = (lpk, step) in watch.late
    watch.late.discard((lpk, step))
    starts = watch.starts.setdefault(lpk, [])
    starts.append((sim.now, late))
    window = per - 2 * MAX_SKEW
    inside = [(t, x) for t, x in starts if t > sim.now - window]
    if len(inside) > count:
        ago = ", ".join(f"{sim.now - t:.1f}" for t, _ in inside)
        bug = None
        message = f"{lpk}: {len(inside)} attempts began within {window:.1f}s (rate {count}/{per:.0f}s): {ago}s ago"
        sim.violate(13, message, bug)


class LimitWatch:
    """Every write of a limit document, seen by the faulty store, and the begins of limited
    attempts (invariant 13 (a), (b))."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        #: per limited document: the true times of its attempts' begins (b), each with whether
        #: it was a late grant's
        self.starts: dict[str, list[tuple[float, bool]]] = {}
        #: (document, step): a grant whose attempt began a rate period or more after it (b)
        self.late: set[tuple[str, str]] = set()
        #: per document: its holders' ``at`` as last written
        self.since: dict[str, dict[str, float]] = {}
        #: per document: the steps holding a slot as last written (a)
        self.holders: dict[str, set[str]] = {}
        #: the executions waiting on a limit and their slots (d), (d')
        self.wf = WfWatch(sim)

    def written(self, doc: Doc) -> None:
        if doc.get("id") == EXEC_ID:  # an execution: (d), if it waits on a limit (sim_wf_limits.py)
            self.wf.exec_written(doc)
            return
        self.wf.limit_written(doc)
        lpk = str(doc["pk"])
        holders = doc.get("holders") or {}
        if doc.get("max") is not None:  # (a rate's slots hold nothing back: its starts are logged)
            for step in set(self.holders.get(lpk, ())) - set(holders):
                self._freed(lpk, str(step))
        self.holders[lpk] = set(holders)
        rate, before = doc.get("rate"), self.since.get(lpk, {})
        per = float(rate[1]) if isinstance(rate, list) and len(rate) == 2 else None
        for step, h in holders.items():
            at = float(h.get("at") or 0.0)
            if per is not None and step in before and at - before[step] >= per - 2 * MAX_SKEW:
                self.late.add((lpk, str(step)))
        self.since[lpk] = {str(k): float(h.get("at") or 0.0) for k, h in holders.items()}

    def _freed(self, lpk: str, step: str) -> None:
        """(a) A slot given back or freed: no attempt of its step still holds a live lease."""
        for f in self.sim.inflight:
            a = f.attempt
            if f"{a.execution_id}|{a.run}|{a.seq}" != step:
                continue
            lease = (self.sim.inner.read(a.execution_id, marker_id(a.seq, a.run)) or {}).get("lease") or {}
            if lease.get("holder") == a.holder and float(lease.get("expires") or 0.0) > self.sim.now + SKEW:
                left = float(lease["expires"]) - self.sim.now
                self.sim.violate(
                    13, f"{lpk}: the slot of {step} was freed while its attempt {a.number} runs ({left:.1f}s)"
                )


def check_settled(sim: Sim) -> None:
    """Invariant 13 (c), after healing: past every due time, one fault-free scan leaves no limit
    document with waiters while it has room."""
    docs = [sim.inner.read(pk, LIMIT_DOC_ID) for pk in sim.inner.scan_partitions("lim:", 10_000)]
    times = [sim.now]
    for doc in docs:
        if doc is None:
            continue
        times.append(float(doc.get("due_at") or 0.0))
        times += [float(h.get("exp") or 0.0) for h in (doc.get("holders") or {}).values()]
        per = float((doc.get("rate") or [0, 0.0])[1])
        times += [float(t) + per for t in doc.get("starts") or []]
    w = sim.workers[0]
    sim.now = max(times) + w.engine.settings.lease_ttl + 2 * SKEW
    sim.run_as(w, "limit scan", w.engine.limits.scan)
    for pk in sim.inner.scan_partitions("lim:", 10_000):
        doc = sim.inner.read(pk, LIMIT_DOC_ID)
        if doc is None:
            continue
        waiters = doc.get("waiters") or []
        free = room(doc, w.engine.clock.now())
        if waiters and free > 0:
            steps = [x.get("s") for x in waiters]
            sim.violate(13, f"{pk}: {len(waiters)} steps wait with room for {free} after healing: {steps}")
    check_wf_settled(sim, w.engine.clock.now())  # (e)
