"""Limits on whole workflow executions in the deterministic simulation (engine/limits/workflows.py).

The plan (:func:`plan_wf_limited`) and invariant 13 (d), (d') and (e); the module docstring of
:mod:`harness.sim_limits` says what they check. The workflow, ``w_tenant``, is registered in the
simulation's registry here (with its limit, ``TENANT``), so sim_workload.py is unchanged.
"""

from __future__ import annotations

from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.documents.model import EXEC_ID, TERMINAL
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import Limit, WorkflowQueueing, limit_pk
from celery_durable.engine.limits.table import room
from celery_durable.engine.limits.workflows import execution_step, is_execution
from celery_durable.engine.starts.deadlines import Timing
from celery_durable.stores.base import Doc
from harness.sim_workload import act, build_registry

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module's importers)
Sim = Any

__all__ = ["TENANT", "WfWatch", "check_wf_settled", "plan_wf_limited", "register", "w_tenant"]

#: at most 2 running executions of ``w_tenant`` per key
TENANT = Limit("sim.tenant", max_running=2, key=lambda key, n, mode: key)
MODES = ("ok", "ok", "sleep", "sleep", "fail", "continue", "charge")
TENANT_KEYS = (["t1"], ["t1", "t2"], ["t1", "t2", "t3"])
#: limited executions planned per seed (``seed % 6 == 4``), at least and at most
MIN_TENANTS, MAX_TENANTS = 3, 7


def w_tenant(key: str, n: int, mode: str) -> int:
    """Under ``sim.tenant`` (keyed by ``key``): ``n`` activities, then by ``mode`` a sleep (it holds
    its slot long), a step that fails it, a continue-as-new (the slot is kept across runs) or a
    limited ``charge`` (an activity limit inside a workflow limit)."""
    total = 0
    for i in range(n):
        total = int(act("add", total, i).result())
    if mode == "sleep":
        wf.sleep(20.0 + 15.0 * n)
    elif mode == "fail":
        return int(act("doomed", key).result())
    elif mode == "continue":
        wf.continue_as_new(key, n + 1, "ok")
    elif mode == "charge":
        total += len(str(act("charge", "a", f"{key}-t{n}", 1).result()))
    return total


def register() -> None:
    """``w_tenant`` in the simulation's (process-wide) registry, once."""
    reg = build_registry()
    if reg.workflow("w_tenant") is None:
        reg.add_workflow("w_tenant", w_tenant, None, TENANT)


class _Op:
    """A client call on one limited execution (``eid`` lets preemption pick it, as sim._ClientOp)."""

    def __init__(self, eid: str, fn: Any) -> None:
        self.eid, self.fn = eid, fn

    def __call__(self) -> None:
        self.fn()


def plan_wf_limited(sim: Sim) -> None:
    """On one seed in six (``seed % 6 == 4``, a subset of the seeds with limited activities; no
    other seed draws here), plan 3-7 executions of ``w_tenant`` over 1-3 keys: some with a
    priority, some with a ``limit_key`` of their own, some delayed, some cancelled (soon after
    their start: often while queued; or later: often while running)."""
    register()
    if sim.reference or sim.seed % 6 != 4:
        return
    from harness.sim_store import Planned  # (sim_store imports sim_limits, which imports this module)

    rng = sim.rng
    keys = rng.choice(TENANT_KEYS)
    first = rng.randint(0, 60)  # the starts come in a burst: queues form
    for n in range(rng.randint(MIN_TENANTS, MAX_TENANTS)):
        args: list[Any] = [keys[n % len(keys)], rng.randint(0, 2), rng.choice(MODES)]
        p = Planned(f"s{sim.seed}-t{n}-w_tenant", "w_tenant", args)
        priority = rng.choice([None, None, None, 0, 1, 5, -1])
        key = rng.choice(keys) if rng.random() < 0.15 else None
        queueing = WorkflowQueueing(key=key, priority=priority) if key is not None or priority is not None else None
        if rng.random() < 0.15:
            p.timing = Timing(None, rng.choice([10.0, 30.0]))
        sim.plan.append(p)
        start = first + rng.randint(0, 25)
        sim._op(start, _Op(p.eid, lambda p=p, q=queueing: _start(sim, p, q)))
        r = rng.random()
        if r < 0.35:
            soon = r < 0.2
            at = rng.randint(start + 1, start + 12) if soon else rng.randint(start + 20, 200)
            sim._op(at, _Op(p.eid, lambda p=p: _cancel(sim, p)))


def _start(sim: Sim, p: Any, queueing: WorkflowQueueing | None) -> None:
    definition = sim.registry.workflow(p.workflow)
    assert definition is not None
    sim.client.engine.start(definition, tuple(p.args), {}, workflow_id=p.eid, timing=p.timing, queueing=queueing)
    p.started = True


def _cancel(sim: Sim, p: Any) -> None:
    ex = sim.inner.read(p.eid, EXEC_ID) if p.started else None
    if ex is not None and ex.get("status") not in TERMINAL:
        sim.count(f"wf_cancel_{ex.get('status')}")
    sim._cancel(p)  # raises (sim._NotStarted) while not started: postponed


class WfWatch:
    """Every write of an execution with a ``limit`` record and of a limit document (invariant 13 (d), (d'))."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        #: per execution with a limit: (its limit document, its status, when it ended) as last written
        self.execs: dict[str, tuple[str, str, float | None]] = {}
        #: per limit document: the executions holding a slot, as last written
        self.holders: dict[str, set[str]] = {}
        #: per limit document: its ``max_running`` as last written
        self.max: dict[str, int] = {}

    def exec_written(self, doc: Doc) -> None:
        record = doc.get("limit")
        pk = str(doc["pk"])
        if not isinstance(record, dict):
            self.execs.pop(pk, None)
            return
        lpk, status = limit_pk(record), str(doc.get("status"))
        old = self.execs.get(pk)
        ended = old[2] if old is not None and old[2] is not None else (self.sim.now if status in TERMINAL else None)
        self.execs[pk] = (lpk, status, ended)
        if status != "running":
            self.sim.count("wf_queued_written" if status == "queued" else "wf_other_written")
            return
        if old is None or old[1] != "running":
            self.sim.count("wf_limited_started")
        if pk not in self.holders.get(lpk, set()):
            self.sim.violate(13, f"{lpk}: execution {pk} was made running without holding a slot")
        running = sorted(e for e, (k, s, _) in self.execs.items() if k == lpk and s == "running")
        top = int(record.get("max") or 0)
        if len(running) == top:
            self.sim.count("wf_limit_full")
        if len(running) > top:
            self.sim.violate(
                13,
                f"{lpk} ({record.get('name')} key {record.get('key')!r}): {len(running)} "
                f"executions running at once, max_running {top}: {running}",
            )

    def limit_written(self, doc: Doc) -> None:
        lpk = str(doc["pk"])
        now = {s[: -len("|wf")] for s in (doc.get("holders") or {}) if is_execution(str(s))}
        for eid in sorted(self.holders.get(lpk, set()) - now):
            _, status, ended = self.execs.get(eid, (lpk, "gone", None))
            if status == "running":
                self.sim.violate(13, f"{lpk}: the slot of execution {eid} was freed while it runs")
            elif ended is not None and self.sim.now - ended > 1.0:
                self.sim.count("wf_slot_freed_late")  # its end's release was lost: freed by the scan
        self.holders[lpk] = now


def check_wf_settled(sim: Sim, now: float) -> None:
    """Invariant 13 (e), after check_settled's fault-free limit scan at ``now``: no execution is
    left ``queued`` while its limit's document has room or holds a slot for it, and every
    planned ``w_tenant`` ended."""
    execs: dict[str, Doc] = sim._execs()
    for pk, ex in sorted(execs.items()):
        record = ex.get("limit")
        if ex.get("status") != "queued" or not isinstance(record, dict):
            continue
        found = sim.inner.read(limit_pk(record), LIMIT_DOC_ID)
        place = "no limit document"
        if found is not None:
            free, step = room(found, now), execution_step(pk)
            holding = step in (found.get("holders") or {})
            if not free and not holding:
                continue  # waits its turn (invariant 5 and the check below: it did not end)
            waiting = any(w.get("s") == step for w in found.get("waiters") or [])
            place = f"room for {free}, " + ("holding a slot" if holding else "waiting" if waiting else "not queued")
        sim.violate(13, f"{pk} is left queued after healing ({place})")
    for p in sim.plan:
        if p.workflow != "w_tenant":
            continue
        ended = execs.get(p.eid)
        status = None if ended is None else ended.get("status")
        if status not in TERMINAL:
            sim.violate(13, f"{p.eid} did not end: {status}")
        else:
            sim.count(f"wf_limited_ended_{status}")
