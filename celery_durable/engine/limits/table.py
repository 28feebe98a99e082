"""One limit document's slots and queue, as pure functions (no store, no clock of their own).

A document ``lim:<name>:<key digest>/slots`` holds:

- ``holders``: ``{step: {"n": attempt number, "exp": until when, "g": group, "at": since}}``, one
  per step that holds a slot (a step, not an attempt: the step's lease already allows one live
  attempt; ``n`` says which attempt the slot is for, so an attempt that lost its lease cannot give
  back the slot of the attempt that took the step over);
- ``waiters``: the steps that found no room, each with its priority ``p``, group ``g``, arrival
  ``at`` and the execution, run and seq to send it again by;
- ``starts``: with a rate, the start times within the last period (a sliding log: the rate holds
  over *any* window of its period, not per fixed minute).

:func:`grant` fills free room from the queue: the lowest priority number first; among equals,
the group with the fewest slots held, then the group served longest ago (``served``: so keys or
workflows take turns), then the oldest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_WAITERS",
    "step_key",
    "room",
    "enqueue",
    "admit",
    "grant",
    "first_of",
    "next_due",
    "expired",
    "drop_waiter",
]

#: a queue longer than this is not recorded: a step past it waits for its recovery re-send
MAX_WAITERS = 1000


def step_key(execution_id: str, run: int, seq: int) -> str:
    return f"{execution_id}|{run}|{seq}"


def _rate(doc: Mapping[str, Any]) -> tuple[int, float] | None:
    rate = doc.get("rate")
    return (int(rate[0]), float(rate[1])) if isinstance(rate, list) and len(rate) == 2 else None


def _recent(doc: Mapping[str, Any], now: float) -> list[float]:
    rate = _rate(doc)
    if rate is None:
        return []
    return [float(t) for t in doc.get("starts") or [] if float(t) > now - rate[1]]


def room(doc: Mapping[str, Any], now: float) -> int:
    """How many more steps may start now (slots and rate both)."""
    free = 1 << 30
    if doc.get("max") is not None:
        free = int(doc["max"]) - len(doc.get("holders") or {})
    rate = _rate(doc)
    if rate is not None:
        free = min(free, rate[0] - len(_recent(doc, now)))
    return max(0, free)


def enqueue(doc: dict[str, Any], waiter: dict[str, Any]) -> bool:
    """Queue ``waiter`` (once, by its step); False when the queue is full."""
    waiters: list[dict[str, Any]] = doc.setdefault("waiters", [])
    if any(w.get("s") == waiter["s"] for w in waiters):
        return True
    if len(waiters) >= MAX_WAITERS:
        return False
    waiters.append(waiter)
    return True


def drop_waiter(doc: dict[str, Any], step: str) -> None:
    doc["waiters"] = [w for w in doc.get("waiters") or [] if w.get("s") != step]


def _take(doc: dict[str, Any], step: str, number: int, group: str, now: float, ttl: float) -> None:
    doc.setdefault("holders", {})[step] = {"n": number, "exp": now + ttl, "g": group, "at": now}
    # when each group was last served, kept for the groups still holding or waiting: the
    # turn goes to the group served longest ago (round robin between keys or workflows)
    live = {str(h.get("g")) for h in doc["holders"].values()} | {str(w.get("g")) for w in doc.get("waiters") or []}
    served = {g: t for g, t in (doc.get("served") or {}).items() if g in live}
    served[group] = now
    doc["served"] = served
    rate = _rate(doc)
    if rate is not None:
        doc["starts"] = [*_recent(doc, now), now]


def admit(doc: dict[str, Any], step: str, number: int, group: str, now: float, ttl: float) -> None:
    """Give ``step`` a slot (the caller checked :func:`room` and the queue)."""
    drop_waiter(doc, step)
    _take(doc, step, number, group, now, ttl)


def _best(doc: Mapping[str, Any]) -> dict[str, Any]:
    held: dict[str, int] = {}
    for h in (doc.get("holders") or {}).values():
        held[str(h.get("g"))] = held.get(str(h.get("g")), 0) + 1
    served: dict[str, float] = doc.get("served") or {}
    waiters: list[dict[str, Any]] = doc["waiters"]
    return min(
        waiters,
        key=lambda w: (
            int(w.get("p") or 0),
            held.get(str(w.get("g")), 0),
            float(served.get(str(w.get("g")), float("-inf"))),
            float(w["at"]),
            str(w.get("e")),
            int(w.get("r") or 0),
            int(w.get("q") or 0),
        ),
    )


def grant(doc: dict[str, Any], now: float, ttl: float) -> list[dict[str, Any]]:
    """Move the best waiters into the free room; the granted waiters (to be sent again)."""
    granted: list[dict[str, Any]] = []
    while room(doc, now) > 0 and doc.get("waiters"):
        best = _best(doc)
        drop_waiter(doc, best["s"])
        _take(doc, best["s"], int(best.get("n") or 1), str(best.get("g")), now, ttl)
        granted.append(best)
    return granted


def first_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The waiter :func:`grant` would pick next."""
    return dict(_best(doc)) if doc.get("waiters") else None


def expired(doc: Mapping[str, Any], now: float) -> list[str]:
    """Holders past their ``exp``: maybe gone (a killed worker), to be checked on their steps."""
    return [s for s, h in (doc.get("holders") or {}).items() if float(h.get("exp") or 0.0) <= now]


def next_due(doc: Mapping[str, Any], now: float) -> float | None:
    """When a scan must look again: only while steps wait, at the first holder's expiry or the
    moment the rate's window lets one more start."""
    if not doc.get("waiters"):
        return None
    times = [float(h.get("exp") or now) for h in (doc.get("holders") or {}).values()]
    rate = _rate(doc)
    recent = _recent(doc, now)
    if rate is not None and len(recent) >= rate[0]:
        times.append(min(recent) + rate[1])
    if room(doc, now) > 0:
        times.append(now)
    return min(times) if times else now
