"""Pause and unpause in the deterministic simulation (engine/admin/pause.py).

On two seeds in seven (``seed % 7 in (1, 5)``; the other seeds run exactly as before: nothing is
drawn from their rng here) an operator pauses one to three executions in flight — chosen when the
call runs among the executions that have not ended (top level, children, limited, keyed,
delayed), preferring one planned — and unpauses each 5 to 120 steps later (in the fault phase or
the healing one); on one of them in two, a batch (engine/admin/batch.py ``apply_page``, page by
page, as the batch workflow's page activity acts) pauses every running execution of one workflow,
then unpauses every execution of it. Its calls go through the shared faulty store (faults, preemption; a preempted
drive, delivery, recovery or the unpause itself may run inside the pause's store calls) and its
process may die at any store call, before or after it applied (the ``abandon`` fault, as
sim_ops.py). Every pause, however it ended, is followed by an unpause that is tried again until
it returns: the operator never leaves an execution paused. Its choices use an rng of its own
(``pause:<seed>``), so only the store calls it makes shift the seed's stream.

Invariant 14. *While paused* is judged in the store's write order (the etag order of the
partition): a write is made while ``pk`` is paused when the exec document of ``pk`` as last
written before it says ``paused`` (a batch is one write: its own exec document counts only for
the writes after it). A drive that read the exec before the pause and commits after it commits
on an etag the pause replaced: its batch fails and there is no write to judge; had it applied,
it would be a write after the pause write, so judged paused (and clause c would catch the flag it
dropped). A write that touches only a marker (an activity's begin, guarded by the marker's etag)
is judged by the exec as last written too.

(a) no write made while ``pk`` is paused creates a step marker (a ``step`` document) of its
current run, and no write that leaves the exec paused creates one;
(b) no attempt (a marker write raising its ``attempts``) begins while ``pk`` is paused on a step
whose marker was created at or after the write that paused it — attempts of steps created before
the pause (an activity message in flight, a retry, recovery's re-send) may begin: they are not
new steps;
(c) the flag is cleared only by an unpause (a write that records an ``unpause`` operation) or by
the execution's end (terminate, a cancel before it started: an ended execution is not paused);
(d) after healing no execution is left paused, and every unpause the operator made returned (the
other end checks, invariants 1 and 5, still require every planned execution to end as a
fault-free run does).
"""

from __future__ import annotations

import random
from typing import Any

from celery_durable.engine.admin.batch import apply_page
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.core import Engine
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.errors import DurableError, OperationRefused, StoreError
from harness.sim_ops import OperatorKilled, OperatorStore
from harness.sim_store import SETTINGS, Actor, SimClock, WorkerCrash

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module's importer)
Sim = Any

__all__ = ["MAX_PAUSES", "check_unpaused", "plan_paused", "pausing"]

#: executions paused per pausing seed, at most
MAX_PAUSES = 3


def pausing(seed: int) -> bool:
    """Whether the seed's operator pauses executions."""
    return seed % 7 in (1, 5)


def plan_paused(sim: Sim) -> None:
    if sim.reference or not pausing(sim.seed):
        return
    rng = random.Random(f"pause:{sim.seed}")
    sim.pause_rng = rng
    sim.unpauses_open = 0
    for _ in range(rng.randint(1, MAX_PAUSES)):
        sim._op(rng.randint(10, 190), _Pause(sim, rng.choice(sim.plan).eid))
    if rng.random() < 0.5:  # a batch pause of every running execution of one workflow, then its unpause
        sim.unpauses_open += 1
        sim._op(rng.randint(10, 190), _BatchPage(sim, "pause", rng.choice(sim.plan).workflow))


def _operator(sim: Sim, rng: random.Random) -> Actor:
    """The operator's process: the shared faulty store, small batches, maybe a death at a call."""
    kill_at = rng.randint(1, 6) if sim.faults_on and rng.random() < sim.faults.abandon else None
    actor = Actor(sim, "operator", 0.0, None)
    store = OperatorStore(sim.store, kill_at, rng.random() < 0.5)
    actor.engine = Engine(store, actor.dispatcher, sim.registry, SETTINGS, SimClock(sim, 0.0))
    actor.engine.identity = lambda: "operator"
    actor.engine.heartbeat.disable()
    return actor


class _Pause:
    """Pause one execution in flight (``eid`` lets preemption pick the call), then plan its unpause."""

    def __init__(self, sim: Sim, eid: str, tries: int = 8) -> None:
        self.sim, self.eid, self.tries = sim, eid, tries

    def __call__(self) -> None:
        sim = self.sim
        rng: random.Random = sim.pause_rng
        live = sorted(pk for pk, ex in sim._execs().items() if ex.get("status") not in TERMINAL)
        if not live:
            if self.tries > 1:  # nothing started yet
                sim._op(sim.step + rng.randint(3, 20), _Pause(sim, self.eid, self.tries - 1))
            return
        if self.eid not in live:
            self.eid = rng.choice(live)
        actor = _operator(sim, rng)
        sim.stack.append(actor)
        try:
            paused = pause(actor.engine, self.eid, by="sim", reason=f"seed {sim.seed}")
            sim.count("pause_returned" if paused else "pause_already")
        except (OperatorKilled, WorkerCrash):
            sim.count("pause_abandoned")
        except OperationRefused:
            sim.count("pause_refused")  # it ended meanwhile
        except (StoreError, DurableError):
            sim.count("pause_store_error")  # maybe applied
        finally:
            sim.stack.pop()
        sim.unpauses_open += 1
        sim._op(sim.step + rng.randint(5, 120), _Unpause(sim, self.eid))


class _Unpause:
    """Unpause ``eid``, again and again until a call returns (or it has ended)."""

    def __init__(self, sim: Sim, eid: str) -> None:
        self.sim, self.eid = sim, eid

    def __call__(self) -> None:
        sim = self.sim
        rng: random.Random = sim.pause_rng
        actor = _operator(sim, rng)
        sim.stack.append(actor)
        try:
            done = unpause(actor.engine, self.eid, by="sim", reason=f"seed {sim.seed}")
            sim.count("unpause_returned" if done else "unpause_not_paused")
        except OperationRefused:
            sim.count("unpause_refused")
        except (OperatorKilled, WorkerCrash, StoreError, DurableError):
            sim.count("unpause_again")
            sim._op(sim.step + rng.randint(1, 15), self)
            return
        finally:
            sim.stack.pop()
        sim.unpauses_open -= 1


class _BatchPage:
    """One page of an operator's batch (engine/admin/batch.py ``apply_page``, as the batch
    workflow's page activity runs it, by a process that may die): pause the running executions of
    one workflow, then, once every page is done, unpause all of its executions. A page whose
    process dies or that gets a store error is acted on again from the same cursor (the activity's
    retry); the unpause is done only when a pass over every page has returned."""

    def __init__(self, sim: Sim, action: str, workflow: str, cursor: str | None = None) -> None:
        self.sim, self.action, self.workflow, self.cursor = sim, action, workflow, cursor

    def __call__(self) -> None:
        sim = self.sim
        rng: random.Random = sim.pause_rng
        actor = _operator(sim, rng)
        query = {"workflow": self.workflow, "status": "running" if self.action == "pause" else None}
        options = {"by": "sim-batch", "reason": f"seed {sim.seed}", "page_size": rng.randint(1, 3)}
        sim.stack.append(actor)
        try:
            # its own id (a batch skips what it acted on already: one recorded by <by>@batch:<id>)
            page = apply_page(actor.engine, self.action, query, self.cursor, options, f"sim-{self.action}")
        except (OperatorKilled, WorkerCrash, StoreError, DurableError):
            sim.count("batch_page_again")
            sim._op(sim.step + rng.randint(1, 15), self)
            return
        finally:
            sim.stack.pop()
        sim.count(f"batch_{self.action}_done", int(page["done"]))
        sim.count(f"batch_{self.action}_refused", int(page["refused"]))
        if page["cursor"] is not None:
            sim._op(sim.step + rng.randint(0, 5), _BatchPage(sim, self.action, self.workflow, page["cursor"]))
        elif self.action == "pause":
            sim._op(sim.step + rng.randint(5, 120), _BatchPage(sim, "unpause", self.workflow))
        else:
            sim.unpauses_open -= 1


def check_unpaused(sim: Sim) -> None:
    """Invariant 14 (d), after healing: nothing left paused, no unpause left unreturned."""
    for pk, ex in sim._execs().items():
        if ex.get("paused"):
            sim.violate(14, f"{pk} was left paused ({ex.get('status')}) after healing")
    if getattr(sim, "unpauses_open", 0):
        sim.violate(14, f"{sim.unpauses_open} unpause call(s) never returned")
