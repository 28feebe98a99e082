"""Dedup keys in the deterministic simulation (issue 26 §5): keyed starts as client operations.

Each seed schedules a few starts of ``w_seq`` with one of two dedup keys and a random
``on_conflict`` (reject, return-existing, latest-wins), each by a starter with its own clock skew
(up to two grace periods either way) whose process may die at any store call, before or after
it applied (the ``abandon`` fault): between its claim and its create, too. Its store calls are
faulted, preempted and observed like any other.

Invariant 10 (checked by the faulty store on every write of an exec, sim_store.py): of the
executions holding a key, at most one is running and not asked to cancel. Invariant 5 (the end
check) covers the rest: every keyed execution ends, superseded ones cancelled.
"""

from __future__ import annotations

from typing import Any

from celery_durable.engine.core import Engine
from celery_durable.engine.starts.dedup import CLAIM_GRACE, OnConflict
from celery_durable.errors import DuplicateStart, StoreError
from harness.sim_ops import OperatorKilled, OperatorStore
from harness.sim_store import SETTINGS, Actor, SimClock, WorkerCrash

#: the scheduler (``sim.Sim``; not imported: ``sim`` imports this module's importer)
Sim = Any

__all__ = ["KEYS", "MAX_KEYED", "KeyedStart", "plan_keyed"]

KEYS = ("dk0", "dk1")
#: keyed starts planned per seed, at most
MAX_KEYED = 6


class KeyedStart:
    """One start with a dedup key, by a starter that may die at any of its store calls."""

    def __init__(self, sim: Sim, n: int, tries: int = 3) -> None:
        self.sim, self.n, self.tries = sim, n, tries
        self.eid = f"s{sim.seed}-k{n}-w_seq"

    def __call__(self) -> None:
        sim = self.sim
        rng = sim.rng
        key, policy = rng.choice(KEYS), rng.choice(list(OnConflict))
        skew = rng.uniform(-2 * CLAIM_GRACE, 2 * CLAIM_GRACE) if rng.random() < 0.3 else rng.uniform(-1, 1)
        kill_at = rng.randint(1, 6) if sim.faults_on and rng.random() < sim.faults.abandon else None
        actor = Actor(sim, "starter", skew, None)
        store = OperatorStore(sim.store, kill_at, rng.random() < 0.5)
        store.max_batch_ops = sim.store.max_batch_ops
        actor.engine = Engine(store, actor.dispatcher, sim.registry, SETTINGS, SimClock(sim, skew))
        actor.engine.identity = lambda: "starter"
        actor.engine.heartbeat.disable()
        definition = sim.registry.workflow("w_seq")
        sim.stack.append(actor)
        try:
            actor.engine.start(definition, (2,), {}, workflow_id=self.eid, dedup=(key, policy))
            sim.count(f"keyed_{policy.value}_returned")
        except DuplicateStart:
            sim.count("keyed_refused")
        except (OperatorKilled, WorkerCrash):
            sim.count("keyed_starter_died")  # its claim may name an execution never created
        except StoreError:
            sim.count("keyed_store_error")
            if self.tries > 1:  # the caller tries again later, with the same id
                sim._op(sim.step + rng.randint(3, 30), KeyedStart(sim, self.n, self.tries - 1))
        finally:
            sim.stack.pop()


def plan_keyed(sim: Sim) -> None:
    rng = sim.rng
    for n in range(rng.randint(0, MAX_KEYED)):
        sim._op(rng.randint(5, 300), KeyedStart(sim, n))
