"""One limit document's slots and queue, as pure functions (no store, no clock of their own).

A document ``lim:<name>:<key digest>/slots`` holds:

- ``holders``: ``{step: {"n": attempt number, "t": marker token, "exp": until when, "g": group,
  "at": since}}``, one per step that holds a slot (a step, not an attempt: the step's lease
  already allows one live attempt; ``n`` and ``t`` say which attempt of which marker the slot is
  for, so an attempt that lost its lease — or whose step a reset re-ran — cannot give back the
  slot of the attempt that took the step over);
- ``waiters``: the steps that found no room, each with its priority ``p``, group ``g``, arrival
  ``at`` and the execution, run and seq to send it again by;
- ``starts``: with a rate, ``[time, step]`` of the starts within the last period (a sliding log:
  the rate holds over *any* window of its period, not per fixed minute); a grant's entry moves to
  the moment its attempt really begins (:func:`restart`).

:func:`grant` fills free room from the queue: the lowest priority number first; among equals,
the group with the fewest slots held, then the group served longest ago (``served``: each live
group's turn number, so keys or workflows take turns), then the oldest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_durable.engine.limits.spec import LIMIT_DOC_ID
from celery_durable.stores.base import Doc

__all__ = [
    "MAX_WAITERS",
    "step_key",
    "holds",
    "room",
    "waits",
    "enqueue",
    "admit",
    "grant",
    "next_due",
    "expired",
    "drop_waiter",
    "restart",
    "has_start",
    "queue_order",
    "rate_opens",
    "declare",
    "new_doc",
    "step_waiter",
]

#: a queue longer than this is not recorded: a step past it waits for its recovery re-send
MAX_WAITERS = 1000


def step_key(execution_id: str, run: int, seq: int) -> str:
    return f"{execution_id}|{run}|{seq}"


def holds(holder: Mapping[str, Any] | None, attempt: tuple[int, str | None]) -> bool:
    """Is ``holder`` the slot of ``attempt`` (its number and its marker's token)?"""
    return holder is not None and (int(holder.get("n") or 0), holder.get("t")) == attempt


def _rate(doc: Mapping[str, Any]) -> tuple[int, float] | None:
    rate = doc.get("rate")
    return (int(rate[0]), float(rate[1])) if isinstance(rate, list) and len(rate) == 2 else None


def _start_time(entry: Any) -> float:
    return float(entry[0]) if isinstance(entry, list) else float(entry)


def _recent_entries(doc: Mapping[str, Any], now: float) -> list[Any]:
    """The rate log's entries (``[time, step]``) within the period before ``now``."""
    rate = _rate(doc)
    if rate is None:
        return []
    return [e for e in doc.get("starts") or [] if _start_time(e) > now - rate[1]]


def _recent(doc: Mapping[str, Any], now: float) -> list[float]:
    return [_start_time(e) for e in _recent_entries(doc, now)]


def has_start(doc: Mapping[str, Any], step: str, now: float) -> bool:
    """Does the rate log hold a start of ``step`` within the period (its grant's, say)?"""
    return any(isinstance(e, list) and len(e) > 1 and e[1] == step for e in _recent_entries(doc, now))


def restart(doc: dict[str, Any], step: str, now: float, moved: bool) -> None:
    """The rate log learns when ``step``'s attempt really began: its grant's entry moves to
    ``now`` (``moved``: it was granted earlier, its message took time to arrive), or a new entry
    (another attempt of a step that kept its slot is another start)."""
    if _rate(doc) is None:
        return
    entries = _recent_entries(doc, now)
    if moved:  # only its grant's entry (the step's latest): an earlier attempt's start stays counted
        mine = [i for i, e in enumerate(entries) if isinstance(e, list) and len(e) > 1 and e[1] == step]
        if mine:
            del entries[mine[-1]]
    doc["starts"] = [*entries, [now, step]]


def room(doc: Mapping[str, Any], now: float, ignoring: str | None = None) -> int:
    """How many more steps may start now (slots and rate both); ``ignoring``: as if that step's
    slot were free (another attempt of a step holding one: may it start now?)."""
    free = 1 << 30
    holders = doc.get("holders") or {}
    if doc.get("max") is not None:
        free = int(doc["max"]) - len(holders) + (1 if ignoring is not None and ignoring in holders else 0)
    rate = _rate(doc)
    if rate is not None:
        free = min(free, rate[0] - len(_recent(doc, now)))
    return max(0, free)


def waits(doc: Mapping[str, Any], step: str) -> bool:
    """Is ``step`` in the queue?"""
    return any(w.get("s") == step for w in doc.get("waiters") or [])


def enqueue(doc: dict[str, Any], waiter: dict[str, Any]) -> bool:
    """Queue ``waiter`` (once, by its step); False when the queue is full."""
    waiters: list[dict[str, Any]] = doc.setdefault("waiters", [])
    if waits(doc, waiter["s"]):
        return True
    if len(waiters) >= MAX_WAITERS:
        return False
    waiters.append(waiter)
    return True


def drop_waiter(doc: dict[str, Any], step: str) -> None:
    doc["waiters"] = [w for w in doc.get("waiters") or [] if w.get("s") != step]


def _take(
    doc: dict[str, Any], step: str, number: int, group: str, now: float, ttl: float, token: str | None = None
) -> None:
    doc.setdefault("holders", {})[step] = {"n": number, "t": token, "exp": now + ttl, "g": group, "at": now}
    # when each group was last served, kept for the groups still holding or waiting: the
    # turn goes to the group served longest ago (round robin between keys or workflows)
    live = {str(h.get("g")) for h in doc["holders"].values()} | {str(w.get("g")) for w in doc.get("waiters") or []}
    served = {g: t for g, t in (doc.get("served") or {}).items() if g in live}
    # a turn number, not a time: hand-offs in the same instant (a coarse or frozen clock) still
    # take turns; above every live group's (an older document's times included)
    served[group] = max(served.values(), default=0.0) + 1
    doc["served"] = served
    if _rate(doc) is not None:
        doc["starts"] = [*_recent_entries(doc, now), [now, step]]


def admit(
    doc: dict[str, Any], step: str, number: int, group: str, now: float, ttl: float, token: str | None = None
) -> None:
    """Give ``step`` a slot (the caller checked :func:`room` and the queue)."""
    drop_waiter(doc, step)
    _take(doc, step, number, group, now, ttl, token)


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
        _take(doc, best["s"], int(best.get("n") or 1), str(best.get("g")), now, ttl, best.get("t"))
        granted.append(best)
    return granted


def expired(doc: Mapping[str, Any], now: float) -> list[str]:
    """Holders past their ``exp``: maybe gone (a killed worker), to be checked on their steps."""
    return [s for s, h in (doc.get("holders") or {}).items() if float(h.get("exp") or 0.0) <= now]


def next_due(doc: Mapping[str, Any], now: float) -> float | None:
    """When a scan must look again: at the first holder's expiry (a holder granted its slot whose
    message was lost is sent again then, one gone is freed), and while steps wait also the moment
    the rate's window lets one more start; never while the document holds nothing."""
    holders = doc.get("holders") or {}
    times = [float(h.get("exp") or now) for h in holders.values()]
    if doc.get("waiters"):
        rate = _rate(doc)
        recent = _recent(doc, now)
        if rate is not None and len(recent) >= rate[0]:
            times.append(min(recent) + rate[1])
        if room(doc, now) > 0:
            times.append(now)
        return min(times) if times else now
    return min(times) if times else None


def rate_opens(doc: Mapping[str, Any], now: float) -> float | None:
    """When the rate lets the next waiter start, if steps wait on the rate alone (slots free)."""
    rate = _rate(doc)
    recent = _recent(doc, now)
    if rate is None or not doc.get("waiters") or len(recent) < rate[0]:
        return None
    free = doc.get("max") is None or int(doc["max"]) > len(doc.get("holders") or {})
    return min(recent) + rate[1] if free else None


def queue_order(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The waiters in the order :func:`grant` would give them slots (as if each in turn)."""
    probe: dict[str, Any] = {k: v for k, v in doc.items() if k in ("holders", "waiters", "served")}
    probe["holders"] = dict(probe.get("holders") or {})
    probe["waiters"] = list(probe.get("waiters") or [])
    order: list[dict[str, Any]] = []
    while probe["waiters"]:
        best = _best(probe)
        drop_waiter(probe, best["s"])
        probe["holders"][best["s"]] = {"g": best.get("g")}
        probe["served"] = dict(probe.get("served") or {}) | {str(best.get("g")): float("inf")}
        order.append(best)
    return order


def declare(doc: Doc, record: Mapping[str, Any]) -> bool:
    """The limit as the latest *scheduled* step's code declared it (``d``: when it was scheduled,
    so an older deploy's step beginning late never restores an older limit); changed?"""
    declared = float(record.get("d") or 0.0)
    if "max" in doc and declared < float(doc.get("declared_at") or 0.0):
        return False
    rate = record.get("rate")
    if doc.get("max") == record.get("max") and doc.get("rate") == rate and "max" in doc:
        return False
    doc["max"], doc["rate"], doc["declared_at"] = record.get("max"), rate, declared
    return True


def new_doc(lpk: str, record: Mapping[str, Any]) -> Doc:
    """A limit document with no holder and no waiter."""
    return {
        "pk": lpk,
        "id": LIMIT_DOC_ID,
        "type": "limit",
        "name": record["name"],
        "key": record["key"],
        "holders": {},
        "waiters": [],
    }


def step_waiter(
    eid: str, run: int, seq: int, number: int, token: str | None, record: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The queue entry of attempt ``number`` of a step (of the marker with ``token``)."""
    return {
        "s": step_key(eid, run, seq),
        "e": eid,
        "r": run,
        "q": seq,
        "n": number,
        "t": token,
        "p": int(record.get("p") or 0),
        "g": str(record.get("g")),
        "at": now,
    }
