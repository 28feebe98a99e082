"""Issue 26 §5, a seeded property test: one running execution per dedup key, whatever the faults.

Each seed runs starts with two keys and every ``on_conflict`` policy, endings (a signal lets a
holder finish) and drives, over a memory store that at every call may fail before the call, fail
after a write applied (the caller sees an error, the write stands), or first run *another* start
to its end (a second caller racing between this one's read and its write). After every action:

* at most one running execution per key is not asked to cancel (a ``latest-wins`` start asks the
  one it replaces; it may still be compensating);
* that one is the key's owner (its owner document names it).

The harness proves it can fail: with a claim that ignores its owner (``_owner`` always "ended") the
same seeds find two running holders.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from celery import Celery

from celery_durable import DuplicateStart, Durable
from celery_durable import workflow as wf
from celery_durable.engine.starts import dedup
from celery_durable.engine.starts.dedup import OnConflict, owner_of
from celery_durable.errors import StoreError, StoreUnavailable
from celery_durable.stores.base import Doc, Op, PartitionRead
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("dedup-property", set_as_current=False)
durable = Durable(app, store="memory://")
KEYS = ("a", "b")
SEEDS = range(150)


@durable.workflow(name="dedup.holder")
def holder(n: int) -> int:
    wf.wait_signal("go", int)
    return n


class ChaosStore(MemoryStore):
    """Faults and preemption at every call while ``armed``."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.armed = False
        self.racers: list[Callable[[], None]] = []
        self.depth = 0

    def _before(self) -> None:
        if not self.armed:
            return
        roll = self.rng.random()
        if roll < 0.15 and self.racers and self.depth < 2:  # another caller, all the way through
            racer = self.racers.pop(0)
            self.depth += 1
            try:
                racer()
            finally:
                self.depth -= 1
        elif roll < 0.20:
            raise StoreUnavailable("injected: before the call")

    def _after(self) -> None:
        if self.armed and self.rng.random() < 0.05:
            raise StoreUnavailable("injected: after the write applied")

    def read(self, pk: str, doc_id: str) -> Doc | None:
        self._before()
        return super().read(pk, doc_id)

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        self._before()
        return super().read_many(pk, ids)

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        self._before()
        return super().query_partition(pk, since)

    def create(self, doc: Doc) -> str | None:
        self._before()
        out = super().create(doc)
        self._after()
        return out

    def replace(self, doc: Doc, if_match: str | None) -> str:
        self._before()
        out = super().replace(doc, if_match)
        self._after()
        return out

    def upsert(self, doc: Doc) -> str:
        self._before()
        out = super().upsert(doc)
        self._after()
        return out

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._before()
        out = super().batch(pk, ops)
        self._after()
        return out


def _violations(env: WorkflowEnvironment) -> list[str]:
    store = env.engine.store
    found: list[str] = []
    for key in KEYS:
        running = [
            e.id
            for e in env.list_executions(workflow="dedup.holder", status="running", limit=500).executions
            if (ex := store.read(e.id, "exec")) is not None
            and ex.get("dedup_key") == key
            and not ex.get("cancel_requested")
        ]
        if len(running) > 1:
            found.append(f"key {key!r}: {len(running)} running holders not asked to cancel: {running}")
        elif running and owner_of(store, key) != running[0]:
            found.append(f"key {key!r}: running holder {running[0]} is not the owner {owner_of(store, key)}")
    return found


def run_seed(seed: int) -> list[str]:
    rng = random.Random(seed)
    store = ChaosStore(rng)
    env = WorkflowEnvironment(durable, store=store)
    engine = env.engine
    counter = iter(range(10_000))

    def start() -> None:
        key, policy = rng.choice(KEYS), rng.choice(list(OnConflict))
        try:
            n = next(counter)
            engine.start(holder.definition, (n,), {}, workflow_id=f"h{n}", dedup=(key, policy))
        except (DuplicateStart, StoreError):
            pass

    problems: list[str] = []
    for step in range(40):
        store.racers = [start for _ in range(rng.randint(0, 2))]
        store.armed = True
        try:
            action = rng.random()
            if action < 0.6:
                start()
            elif action < 0.8:
                running = env.list_executions(workflow="dedup.holder", status="running").executions
                if running:
                    engine.signal(rng.choice(running).id, "go", 1)
            else:
                env.advance(rng.choice((1.0, 30.0, dedup.CLAIM_GRACE)))
        except StoreError:
            pass
        finally:
            store.armed = False
        try:
            env.run_until_idle()
        except StoreError:
            pass
        problems += [f"seed {seed} step {step}: {v}" for v in _violations(env)]
        if problems:
            break
    return problems


@pytest.mark.parametrize("seed", SEEDS)
def test_one_running_execution_per_key_under_faults_and_races(seed: int) -> None:
    problems = run_seed(seed)
    assert not problems, problems


def test_the_property_catches_a_claim_that_ignores_its_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "_owner", lambda engine, owner, now: dedup.Owner.ENDED)
    caught = [seed for seed in SEEDS if run_seed(seed)]
    assert len(caught) > len(SEEDS) // 2, f"a broken claim went unnoticed in most seeds: caught {len(caught)}"


def test_the_property_catches_a_takeover_without_its_tombstone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug the property found first: a ``latest-wins`` start took the key from an owner not
    created yet, whose starter then created it (two holders). Put back, it is caught."""
    monkeypatch.setattr(dedup, "_tombstone", lambda engine, owner, eid, key, now: True)
    caught = [seed for seed in SEEDS if run_seed(seed)]
    assert caught, "a takeover that does not stop the owner's late create went unnoticed"
