"""Document shapes of one execution (DESIGN.md §5) and small shared helpers.

Partition = execution id. Documents:

* ``exec`` — workflow name, encoded payload, parent link, status, result/error, cancel flag,
  lease, wake-up counter.
* ``s:000001`` … — one *marker* per durable step, keyed by call order. ``kind`` + ``name`` are
  checked on replay (non-determinism). Steps that produce their value while driving
  (``now``/``uuid``/``random``) keep it inline in the marker.
* ``r:000001`` … — the step's *result*, written create-only: the first writer wins, so a
  duplicate delivery or a racing worker can never overwrite it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from ..stores.base import Doc, strip_reserved

__all__ = [
    "EXEC_ID",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TERMINAL",
    "Clock",
    "SystemClock",
    "marker_id",
    "result_id",
    "error_info",
    "worker_identity",
    "lease_live",
    "settled",
]

EXEC_ID = "exec"

RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})

#: due kinds (see stores.base): an execution needing a drive, a lost/lapsed activity attempt
DUE_EXEC = "exec"
DUE_ACTIVITY = "activity"
DUE_CLOCK = "clock"
DUE_CHILD = "child"


class Clock(Protocol):
    """Wall-clock time in epoch seconds; the testing environment swaps in a fake one."""

    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


# Step documents are keyed by run (continue-as-new starts run 1, 2, …) and call order.
def marker_id(seq: int, run: int = 0) -> str:
    return f"s{run or ''}:{seq:06d}"


def result_id(seq: int, run: int = 0) -> str:
    return f"r{run or ''}:{seq:06d}"


def signal_id(name: str, run: int = 0) -> str:
    return f"sig{run or ''}:{name}"


def parse_step_id(doc_id: str) -> tuple[int, int]:
    """``"s2:000007"`` → ``(run 2, seq 7)``."""
    head, _, tail = doc_id.partition(":")
    return int(head[1:] or 0), int(tail)


def error_info(exc: BaseException, attempts: int | None = None) -> dict[str, Any]:
    """What we store about an exception: type name, message, a short traceback."""
    info: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc, limit=8))[-4000:],
    }
    if attempts is not None:
        info["attempts"] = attempts
    return info


_identity_lock = threading.Lock()
_identity: tuple[int, str] | None = None


def worker_identity() -> str:
    """A lease-holder id unique to this process (recomputed after fork)."""
    global _identity
    with _identity_lock:
        pid = os.getpid()
        if _identity is None or _identity[0] != pid:
            _identity = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
        return _identity[1]


def settled(doc: Doc) -> Doc:
    """A copy to write back with no lease and out of every scan (the step or exec is done)."""
    return strip_reserved(doc) | {"lease": None, "due_kind": None, "due_at": None}


def lease_live(doc: Doc, now: float) -> bool:
    """Whether the document's lease is held and not expired."""
    lease = doc.get("lease") or {}
    return "expires" in lease and float(lease["expires"]) > now


@dataclass(frozen=True)
class Settings:
    """Engine timings, in seconds (the Celery glue fills them from ``durable_*`` settings)."""

    lease_ttl: float = 30.0
    heartbeat_interval: float = 10.0
    #: an activity message not picked up this long after sending is considered lost
    activity_queue_timeout: float = 300.0
    #: an execution that needs a drive and got none this long is re-driven by recovery
    drive_timeout: float = 30.0
    #: how long before an execution whose workflow is unknown here is tried again
    unknown_retry_delay: float = 60.0
    #: times an activity may be lost (worker killed) before it is failed
    max_lost_attempts: int = 10
    #: conflicts tolerated in optimistic drives before taking the exec lease
    optimistic_attempts: int = 2
    #: an activity's inline drive reuses the partition read at its start if younger than this
    trust_cache_for: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval < self.lease_ttl:
            raise ValueError("heartbeat_interval must be > 0 and < lease_ttl")
