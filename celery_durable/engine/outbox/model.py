"""Documents, constants and value types of the effect outbox (docs/architecture.md §9). No Celery here.

Documents
---------
* **Lane** ``fxq:{key}`` — one partition per ordering key, holding

  - the **rows** ``fx:{effect_id}``: type, payload, status ``pending|running|succeeded|failed|
    cancelled``, attempt, available-at, lease (owner + expiry), last error, timestamps;
  - the **head** ``head``: the *live* (pending or running) rows of the key as a sorted list of
    ``[created_at, effect_id, type]`` and the id of the running row. Claims and settles read two
    documents (head, row) and write both in one all-or-nothing partition batch, so their cost
    never depends on the key's history: settled rows stay in the partition until pruned but
    nothing reads them.
* **Index** ``fxid:{effect_id}`` / ``fx`` — which key an effect id went to: global dedupe of
  enqueues and lookup by id (``get``, ``cancel``).
* **Intent** — a portable copy of an enqueue (``effect`` field) that can live in *any* partition:
  ``fxi:{effect_id}`` in the caller's partition (``OutboxEngine.intent``; the transactional
  outbox), or the ``emit`` step marker of a workflow. It carries the due kind ``outbox_admit``;
  *admission* moves it into its lane (idempotent by effect id) and then clears it.

Due kinds (:meth:`Store.scan_due` — the scans cost what is due, not what is stored)
-----------------------------------------------------------------------------------
``outbox`` on a head: when the lane next needs attention (a claimable row whose message may be
lost, a retry whose delay passed, a lease that expires); ``outbox_admit`` on intents not yet
admitted; ``outbox_prune`` on succeeded/cancelled rows once their retention ends.

Ordering
--------
A row may be claimed only when it is the first live row of its key by ``(created_at, id)``,
nothing of the key is running and its ``available_at`` has passed: a row waiting for a retry
blocks the later rows of its key. A row admitted late (its intent recovered by the scan) is
placed by its ``created_at`` but never ahead of a running row.

Row states: ``pending`` → (claim: attempt+1, lease) ``running`` → ``succeeded`` | ``failed`` |
``pending`` again (retry after the backoff, or requeue after a lost worker of a replay-safe type);
``pending``/``running`` → ``cancelled`` at any time. Terminal rows leave the head's live list.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import DurableError
from ...settings import Settings
from ...stores.base import Doc, strip_reserved

__all__ = [
    "DUE_LANE",
    "DUE_ADMIT",
    "DUE_PRUNE",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "RETRY",
    "TERMINAL",
    "LIVE",
    "HEAD_ID",
    "INDEX_ID",
    "OutboxSettings",
    "EffectRef",
    "EffectSender",
    "InlineSender",
    "Claim",
    "ClaimResult",
    "ScanReport",
    "Admitted",
    "LaneFull",
    "lane_pk",
    "row_id",
    "index_pk",
    "intent_id",
    "strip",
    "claim_latency",
]

DUE_LANE = "outbox"
DUE_ADMIT = "outbox_admit"
DUE_PRUNE = "outbox_prune"

PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
#: settle verb: back to pending after a delay
RETRY = "retry"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
LIVE = frozenset({PENDING, RUNNING})

HEAD_ID = "head"
INDEX_ID = "fx"


def lane_pk(key: str) -> str:
    return f"fxq:{key}"


def row_id(effect_id: str) -> str:
    return f"fx:{effect_id}"


def index_pk(effect_id: str) -> str:
    return f"fxid:{effect_id}"


def intent_id(effect_id: str) -> str:
    return f"fxi:{effect_id}"


#: a document without its ``_etag``, ready to write back
strip = strip_reserved


class LaneFull(DurableError):
    """A key has too many live rows (the head document would outgrow the store's limit)."""


@dataclass(frozen=True)
class OutboxSettings:
    """Timings in seconds: the outbox's view of the library's one ``Settings`` (defaults from it)."""

    lease_ttl: float = Settings.lease_ttl
    heartbeat_interval: float = Settings.heartbeat_interval
    #: a claimable row not claimed this long after its message was sent is sent again
    queue_timeout: float = Settings.outbox_queue_timeout
    #: succeeded and cancelled rows are deleted this long after settling (failed rows are kept)
    retention: float = Settings.outbox_retention
    #: how often a running handler's row is re-read for cancellation (and the timeout checked)
    cancel_poll: float = Settings.outbox_cancel_poll
    #: rows available within this delay get a countdown message; later ones wait for the scan
    fast_send_max: float = Settings.outbox_fast_send_max
    #: an intent its enqueuer did not admit within this delay is admitted by the scan
    admit_grace: float = Settings.outbox_admit_grace
    max_lane_backlog: int = Settings.outbox_max_lane_backlog

    @classmethod
    def of(cls, settings: Settings) -> OutboxSettings:
        """The outbox's view of the library's one :class:`~celery_durable.settings.Settings`."""
        return cls(
            lease_ttl=settings.lease_ttl,
            heartbeat_interval=settings.heartbeat_interval,
            queue_timeout=settings.outbox_queue_timeout,
            retention=settings.outbox_retention,
            cancel_poll=settings.outbox_cancel_poll,
            fast_send_max=settings.outbox_fast_send_max,
            admit_grace=settings.outbox_admit_grace,
            max_lane_backlog=settings.outbox_max_lane_backlog,
        )


@dataclass(frozen=True)
class EffectRef:
    """What a message for one row carries."""

    key: str
    effect_id: str
    type: str


class EffectSender(Protocol):
    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        """Deliver ``ref`` to a worker that runs its handler (after ``countdown`` seconds)."""
        ...


class InlineSender:
    """Keeps what would be sent (engine tests)."""

    def __init__(self) -> None:
        self.sent: list[tuple[EffectRef, float | None]] = []

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        self.sent.append((ref, countdown))

    def take(self) -> list[EffectRef]:
        out = [ref for ref, _ in self.sent]
        self.sent.clear()
        return out


@dataclass
class Claim:
    """A row this worker claimed: it owns the lease while ``etag`` is the row's version."""

    key: str
    effect_id: str
    type: str
    payload: Any
    attempt: int
    max_attempts: int
    replay_safe: bool
    owner: str
    row: Doc
    etag: str
    #: the head as this claim wrote it (with its etag): the settle tries it before reading
    head: Doc | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: set by a renewal or settle that found the row cancelled / owned by someone else
    cancelled: bool = False
    lost: bool = False

    @property
    def ref(self) -> EffectRef:
        return EffectRef(self.key, self.effect_id, self.type)


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim | None
    #: claimed | blocked | early | duplicate | settled | missing
    reason: str
    #: for ``early``: seconds until the row is available
    wait: float = 0.0


@dataclass(frozen=True)
class Admitted:
    effect_id: str
    key: str
    #: False when the effect id was already enqueued (nothing written, nobody woken)
    created: bool


@dataclass
class ScanReport:
    admitted: int = 0
    resent: int = 0
    requeued: int = 0
    failed: int = 0
    pruned: int = 0
    repaired: int = 0
    errors: int = 0


# --- emit from workflow code: intents noted during a replay, admitted after its commit -------


def claim_latency(row: Doc) -> float | None:
    """Seconds between a row becoming claimable and its (last) claim."""
    started, eligible = row.get("started_at"), row.get("eligible_at")
    if started is None or eligible is None:
        return None
    return max(0.0, float(started) - float(eligible))
