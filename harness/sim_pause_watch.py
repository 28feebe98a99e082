"""Invariant 14 (a, b, c) of the deterministic simulation, watched on every write of the faulty
store (sim_store.FaultyStore): nothing new is taken while an execution is paused. The statement,
and what *while paused* means, is in harness/sim_pause.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_durable.engine.documents.model import EXEC_ID, TERMINAL
from celery_durable.stores.base import Doc

__all__ = ["PauseWatch"]


def _marker_of_run(doc_id: str, run: int) -> bool:
    """Whether ``doc_id`` is a step marker of run ``run`` (``s:000007``, ``s2:000007``)."""
    head, sep, tail = doc_id.partition(":")
    return bool(sep) and head[:1] == "s" and head[1:] == ("" if run == 0 else str(run)) and tail.isdigit()


class PauseWatch:
    """Invariant 14 (a, b, c) on every write of the faulty store (sim_store.FaultyStore)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.writes = 0  # the store's write order
        self.execs: dict[str, Doc] = {}  # as last written before the current write
        self.since: dict[str, int] = {}  # pk -> the write that paused it
        self.born: dict[tuple[str, str], int] = {}  # marker -> the write that created it
        self.attempts: dict[tuple[str, str], int] = {}
        self._unit: list[tuple[Doc, bool]] | None = None
        #: other watchers of every write unit, in the store's order (sim_batch.py)
        self.also: list[Callable[[str, list[tuple[Doc, bool]]], None]] = []

    def begin(self) -> None:
        """A batch begins: its documents are one write."""
        self._unit = []

    def end(self, pk: str) -> None:
        unit, self._unit = self._unit or [], None
        self._apply(pk, unit)

    def written(self, doc: Doc, created: bool) -> None:
        if self._unit is not None:
            self._unit.append((doc, created))
        else:
            self._apply(str(doc["pk"]), [(doc, created)])

    def deleted(self, pk: str, doc_id: str) -> None:
        if doc_id == EXEC_ID:
            self.execs.pop(pk, None)
            self.since.pop(pk, None)
        self.born.pop((pk, doc_id), None)
        self.attempts.pop((pk, doc_id), None)

    def _apply(self, pk: str, unit: list[tuple[Doc, bool]]) -> None:
        self.writes += 1
        for watch in self.also:
            watch(pk, unit)
        n = self.writes
        prev = self.execs.get(pk) or {}
        paused = bool(prev.get("paused"))
        if paused:
            self.sim.count("writes_while_paused")
        new = next((d for d, _ in unit if d.get("id") == EXEC_ID), None)
        for doc, created in unit:
            did = str(doc.get("id"))
            if doc.get("type") != "step":
                continue
            key = (pk, did)
            if created or key not in self.born:
                self.born[key] = n
                if paused and _marker_of_run(did, int(prev.get("run") or 0)):
                    self._violate(pk, f"{did} was created while paused (since write {self.since.get(pk)})")
                elif new is not None and new.get("paused") and _marker_of_run(did, int(new.get("run") or 0)):
                    self._violate(pk, f"{did} was created by a write that leaves it paused")
            number = int(doc.get("attempts") or 0)
            if paused and number > self.attempts.get(key, 0) and self.born[key] >= self.since.get(pk, n + 1):
                self._violate(pk, f"attempt {number} of {did}, a step created while paused, began")
            self.attempts[key] = number
        if new is None:
            return
        if new.get("paused") and not paused:
            self.since[pk] = n
        unpaused = any(d.get("type") == "operation" and d.get("action") == "unpause" for d, c in unit if c)
        if paused and not new.get("paused") and not unpaused and new.get("status") not in TERMINAL:
            self._violate(pk, f"the pause was dropped by a write that records no unpause (now {new.get('status')})")
        self.execs[pk] = dict(new)

    def _violate(self, pk: str, what: str) -> None:
        self.sim.count("pause_violation")
        self.sim.violate(14, f"{pk}: {what}")
