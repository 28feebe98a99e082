"""FaultyStore (the simulation's store) injects its faults into read_many as into read."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace
from typing import Any

import pytest

from celery_durable.errors import StoreUnavailable
from celery_durable.stores.memory import MemoryStore
from harness.sim_store import NO_FAULTS, Faults, FaultyStore, WorkerCrash


class FakeSim:
    """The parts of the scheduler FaultyStore._call uses: one worker actor, faults on."""

    def __init__(self, faults: Faults) -> None:
        self.rng = random.Random(0)
        self.seed = 0
        # these tests are about read faults: no sticky-cache faults (FakeSim has no engines)
        self.faults = dataclasses.replace(faults, evict=0.0, thread=0.0)
        self.faults_on = True
        self.client_faults = False
        self.worker = SimpleNamespace(name="w0", worker=0, alive=True)
        self.preempted: list[str | None] = []
        self.stats: dict[str, int] = {}

    def actor(self) -> Any:
        return self.worker

    def maybe_preempt(self, pk: str | None) -> None:
        self.preempted.append(pk)

    def count(self, kind: str, n: int = 1) -> None:
        self.stats[kind] = self.stats.get(kind, 0) + n

    def crash(self, actor: Any) -> None:
        actor.alive = False


def _store(faults: Faults) -> tuple[FaultyStore, MemoryStore, FakeSim]:
    inner, sim = MemoryStore(), FakeSim(faults)
    inner.create({"pk": "p", "id": "a", "v": 1})
    return FaultyStore(inner, sim), inner, sim  # type: ignore[arg-type]


def test_read_many_passes_through_without_faults() -> None:
    store, inner, sim = _store(NO_FAULTS)
    assert [d and d["v"] for d in store.read_many("p", ["a", "b"])] == [1, None]
    assert inner.calls.get("read_many") == 1 and sim.preempted == ["p"]  # a preemption point, as read is


@pytest.mark.parametrize("method", ["read", "read_many"])
def test_read_many_fails_before_the_call_like_read(method: str) -> None:
    store, inner, sim = _store(Faults(before=1.0, after=0.0, crash=0.0))
    inner.calls.clear()
    call = (lambda: store.read("p", "a")) if method == "read" else (lambda: store.read_many("p", ["a"]))
    with pytest.raises(StoreUnavailable, match="injected"):
        call()
    assert inner.calls == {} and sim.stats == {"store_before": 1}  # never reached the inner store


def test_read_many_can_crash_the_worker() -> None:
    store, inner, sim = _store(Faults(before=0.0, after=0.0, crash=1.0))
    with pytest.raises(WorkerCrash):
        store.read_many("p", ["a"])
    assert not sim.worker.alive
