"""Faults of the sticky cache in the simulation: live instances evicted, drives moved to another thread.

Each simulated worker's driver keeps live workflow instances (``engine/replay/sticky.py``). Drives
already land on random workers (a process change); at any store call these faults also evict
one of the calling worker's live instances (it is unwound) or move the worker to its other
"thread" (its other set of live instances: those left there may be found stale later). They
draw from their own ``random.Random`` (derived from the seed), so turning them on or off leaves
every other fault of a seed where it was.
"""

from __future__ import annotations

import random
import threading
from typing import Protocol

from celery_durable.engine.core import Engine

__all__ = ["StickyFaults"]


class _Actor(Protocol):  # sim_store.Actor (which imports this module)
    name: str
    worker: int | None
    alive: bool
    engine: Engine


class _Faults(Protocol):  # sim_store.Faults (frozen)
    @property
    def evict(self) -> float: ...

    @property
    def thread(self) -> float: ...


class StickyFaults:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"sticky:{seed}")
        #: each worker's two "threads": the sticky cache's per-thread state, by worker name
        self.threads: dict[str, list[threading.local]] = {}

    def shake(self, actor: _Actor | None, faults: _Faults) -> str | None:
        """Maybe evict a live instance of ``actor`` or move it to its other thread; what was done."""
        if faults.evict <= 0 and faults.thread <= 0:
            return None
        if actor is None or actor.worker is None or not actor.alive:
            return None
        sticky = actor.engine.driver.sticky
        if faults.evict > 0 and self.rng.random() < faults.evict:
            held = sticky.held()
            if held:
                sticky.drop(self.rng.choice(held))
                return "sticky_evict"
        if faults.thread > 0 and self.rng.random() < faults.thread:
            pair = self.threads.setdefault(actor.name, [sticky._local, threading.local()])
            sticky._local = pair[1] if sticky._local is pair[0] else pair[0]  # as if another pool thread ran it
            return "sticky_thread"
        return None
