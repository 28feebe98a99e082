"""Documents, constants and value types of the effect outbox (docs/architecture.md §9). No Celery here.

Documents
---------
* **Lane** ``fxq:{key}`` — one partition per ordering key, holding

  - the **rows** ``fx:{effect_id}``: type, payload, the lane sequence number ``seq`` given at
    admission, status ``pending|running|succeeded|failed|cancelled``, attempt, available-at,
    lease (owner + expiry), last error, timestamps;
  - the **head** ``head``: the next sequence number, the *live* (pending or running) rows of the
    key as a list of ``[seq, effect_id, type]`` in ``seq`` order, and the id of the row whose
    handler holds the key (``running``). Claims and settles read two documents (head, row) and
    write both in one all-or-nothing partition batch, so their cost never depends on the key's
    history. The head is deleted with the last live row (a lane of unkeyed effects leaves
    nothing behind) and never grows past half the store's item limit (``LaneFull``).
* **Index** ``fxid:{effect_id}`` / ``fx`` — the key, type and payload digest an effect id was
  first enqueued with: global dedupe (a repeat is ``created=False``; the same id with another
  type, key or payload is an ``IdempotencyConflict``) and lookup by id (``get``, ``cancel``).
  It is never moved to another key, so two enqueuers racing with one id meet in one lane.
* **Intent** — a portable copy of an enqueue (``effect`` field) that can live in *any* partition:
  ``fxi:{effect_id}`` in the caller's partition (``OutboxEngine.intent``; the transactional
  outbox), or the ``emit`` step marker of a workflow. It carries the due kind ``outbox_admit``;
  *admission* moves it into its lane (idempotent by effect id) and then clears it.

Due kinds (:meth:`Store.scan_due` — the scans cost what is due, not what is stored)
-----------------------------------------------------------------------------------
``outbox`` on a head: when the lane next needs attention (a claimable row whose message may be
lost, a retry whose delay passed, a lease that expires); ``outbox_admit`` on intents not yet
admitted; ``outbox_prune`` on succeeded/cancelled rows once their retention ends;
``outbox_failed`` on failed rows, at their failure time: no scan processes it, it only lets
``problems`` list the failed rows of every lane with one query (a retried row lets go of it).

Ordering
--------
A row may be claimed only when it is the first live row of its key by ``seq`` (the order of
admission into the lane, never a clock), nothing of the key holds it and its ``available_at``
has passed: a row waiting for a retry blocks the later rows of its key. A cancelled *running*
row leaves the live list at once but keeps holding its key (``running``) until its handler
stopped (its settle) or its lease expired, so the next row never overlaps it.

Row states: ``pending`` → (claim: attempt+1, lease) ``running`` → ``succeeded`` | ``failed`` |
``pending`` again (retry after the backoff, or requeue after a lost worker of a replay-safe type);
``pending``/``running`` → ``cancelled`` at any time. Terminal rows leave the head's live list.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_durable.engine.documents.model import Clock
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.outcomes import ClaimOutcome
from celery_durable.errors import LaneFull, StoreUnavailable
from celery_durable.settings import Settings
from celery_durable.stores.base import Doc, Store, reads_may_lag, strip_reserved

__all__ = [
    "ConflictPause",
    "DUE_LANE",
    "DUE_ADMIT",
    "DUE_PRUNE",
    "DUE_FAILED",
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
    "LaneOps",
    "InlineSender",
    "Claim",
    "ClaimResult",
    "ScanReport",
    "Admitted",
    "LaneFull",
    "ClaimUnknown",
    "adopt_of",
    "lane_pk",
    "row_id",
    "index_pk",
    "intent_id",
    "strip",
    "claim_latency",
    "digest",
    "head_bytes",
    "settled_due",
]

DUE_LANE = "outbox"
DUE_ADMIT = "outbox_admit"
DUE_PRUNE = "outbox_prune"
#: on failed rows: never processed by a scan, an index of failures across lanes (``problems``)
DUE_FAILED = "outbox_failed"

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


@dataclass(frozen=True)
class OutboxSettings:
    """Timings in seconds: the outbox's view of the library's one ``Settings`` (defaults from it)."""

    lease_ttl: float = Settings.lease_ttl
    heartbeat_interval: float = Settings.heartbeat_interval
    #: a claimable row not claimed this long after its message was sent is sent again
    queue_timeout: float = Settings.outbox_queue_timeout
    #: succeeded and cancelled rows are deleted this long after settling (failed rows are kept)
    retention: float = Settings.outbox_retention
    #: how often beat runs the liveness scan: a due lane or intent not acted on within two of
    #: these is reported stuck (``problems``)
    scan_interval: float = Settings.outbox_scan_interval
    #: how often a running handler's row is re-read for cancellation (and the timeout checked)
    cancel_poll: float = Settings.outbox_cancel_poll
    #: rows available within this delay get a countdown message; later ones wait for the scan
    fast_send_max: float = Settings.outbox_fast_send_max
    #: an intent its enqueuer did not admit within this delay is admitted by the scan
    admit_grace: float = Settings.outbox_admit_grace
    max_lane_backlog: int = Settings.outbox_max_lane_backlog
    drain_max: int = Settings.outbox_drain_max

    @classmethod
    def of(cls, settings: Settings) -> OutboxSettings:
        """The outbox's view of the library's one :class:`~celery_durable.settings.Settings`."""
        return cls(
            lease_ttl=settings.lease_ttl,
            heartbeat_interval=settings.heartbeat_interval,
            queue_timeout=settings.outbox_queue_timeout,
            retention=settings.outbox_retention,
            scan_interval=settings.outbox_scan_interval,
            cancel_poll=settings.outbox_cancel_poll,
            fast_send_max=settings.outbox_fast_send_max,
            admit_grace=settings.outbox_admit_grace,
            max_lane_backlog=settings.outbox_max_lane_backlog,
            drain_max=settings.outbox_drain_max,
        )


@dataclass(frozen=True)
class EffectRef:
    """What a message for one row carries."""

    key: str
    effect_id: str
    type: str
    #: the ids of the key's rows enqueued right after this one, if the sender knew them (a hint,
    #: not part of the identity: the claim reads them with the head, so the first settles of its
    #: drain need no read of their own)
    after: tuple[str, ...] = field(default=(), compare=False)


class EffectSender(Protocol):
    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        """Deliver ``ref`` to a worker that runs its handler (after ``countdown`` seconds)."""
        ...


class LaneOps(Protocol):
    """What admission and the scan need of the outbox engine (``machine.OutboxEngine``): typed
    here so that ``machine`` imports them and never the other way round."""

    store: Store
    sender: EffectSender
    settings: OutboxSettings
    clock: Clock
    bugs: frozenset[str]
    pause: ConflictPause

    def admit_intent(self, doc: Doc) -> Admitted | None: ...

    def send(self, ref: EffectRef, countdown: float | None = None) -> None: ...

    def _head_due(self, head: Doc, now: float) -> None: ...

    def _wake_first(self, head: Doc) -> None: ...

    def _emit(self, event: str, **kwargs: Any) -> None: ...


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
    #: when the claim was written (the engine's clock): a run that starts much later re-checks
    claimed_at: float = 0.0
    #: set by a renewal or settle that found the row cancelled / owned by someone else
    cancelled: bool = False
    lost: bool = False
    #: the next row of the key, claimed for this worker in the same batch as this one's settle
    successor: Claim | None = field(default=None, repr=False)
    #: rows after this one, read ahead with a head (by effect id, with their etags): the settles
    #: of a drain claim them without reading first (the batch's etags guard a stale one)
    ahead: dict[str, Doc] = field(default_factory=dict, repr=False)
    #: settles of this drain still to read the head first (a blind one found it moved)
    read_first: int = 0

    @property
    def ref(self) -> EffectRef:
        return EffectRef(self.key, self.effect_id, self.type)


class ClaimUnknown(StoreUnavailable):
    """A claim's batch raised a store error and reading it back failed too, or did not find the
    claim (which may still land: a request in flight, a lagging replica): the row may be
    claimed by ``owner`` (attempt ``attempt``), a handler that never started. Whoever delivers the
    row again passes them as ``claim(adopt=...)``: a claim that applied is then taken over (one
    etag-guarded write: a duplicate of that delivery cannot take it as well) and run, instead of
    waiting for its lease to expire (after which a process-bound effect would be failed unrun).
    ``owners``: ``owner`` and, when the unknown write was itself a take-over, the owners it took
    over from (the lease names one of them): the retry passes them all as ``adopt=(owners, attempt)``."""

    def __init__(self, message: str, owner: str, attempt: int, earlier: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.owner = owner
        self.attempt = attempt
        self.owners: tuple[str, ...] = (owner, *earlier)


def adopt_of(value: Any) -> tuple[tuple[str, ...], int] | None:
    """An adopt header, ``[owner or [owners], attempt]``, as ``claim(adopt=...)`` takes it (None if malformed)."""
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], int):
        return None
    owners = [value[0]] if isinstance(value[0], str) else value[0]
    if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
        return None
    return tuple(owners[:16]), value[1]


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim | None
    reason: ClaimOutcome
    #: for ``early``: seconds until the row is available; ``contended``: until it is tried again
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
    #: intents left for later because their key's lane is full
    deferred: int = 0
    errors: int = 0


# --- emit from workflow code: intents noted during a replay, admitted after its commit -------


def claim_latency(row: Doc) -> float | None:
    """Seconds between a row becoming claimable and its (last) claim."""
    started, eligible = row.get("started_at"), row.get("eligible_at")
    if started is None or eligible is None:
        return None
    return max(0.0, float(started) - float(eligible))


def settled_due(status: str, now: float, retention: float) -> Doc:
    """The due fields of a row settling ``status`` (succeeded or failed): a succeeded row is pruned
    once ``retention`` passed; a failed row is kept, indexed under ``outbox_failed`` at ``now``
    (in the row itself: no request of its own, but on Cosmos one index entry written with it)."""
    if status == FAILED:
        return {"due_kind": DUE_FAILED, "due_at": now}
    return {"due_kind": DUE_PRUNE, "due_at": now + retention}


def digest(effect: Doc) -> str:
    """What makes two enqueues of one effect id the same request: type, key and payload."""
    body = json.dumps([effect["type"], effect["key"], effect.get("payload")], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def head_bytes(live: list[list[Any]]) -> int:
    """The JSON size of a head's live list (ASCII-escaped: never less than the stored UTF-8)."""
    return len(json.dumps(live, separators=(",", ":")))


class ConflictPause:
    """What a store-bound loop does after a conditional write lost (or a read missed what a
    create just found). On a store whose reads may lag (Cosmos at Session consistency) the next
    read may serve the same stale version for as long as the replica lags (another process's
    write: no token of ours covers it), so wait a little before reading again (10 ms doubling to
    0.5 s, about 10 s over the first 25 rounds) instead of spending every round at once on one
    stale version. Elsewhere a re-read is fresh: no wait."""

    def __init__(self, store: Store) -> None:
        self.lagging = reads_may_lag(store)

    def __call__(self, rounds: int) -> None:
        if self.lagging:
            time.sleep(min(0.5, 0.01 * 2 ** min(rounds, 6)))


def held_by(row: Doc | None, head: Doc | None, effect_id: str, owners: Collection[str], attempt: int) -> bool:
    """Whether ``row`` runs its ``attempt`` under a lease of one of ``owners`` and holds its key:
    a claim whose answer was lost applied (``OutboxEngine._claimed_anyway``), or may be adopted
    (``OutboxEngine.claim``)."""
    if row is None or head is None or row.get("status") != RUNNING:
        return False
    lease = row.get("lease") or {}
    return lease.get("owner") in owners and count_of(row, "attempt") == attempt and head.get("running") == effect_id
