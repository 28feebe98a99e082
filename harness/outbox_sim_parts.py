"""Parts of the outbox simulation (:mod:`harness.outbox_sim`): faults, invariants,
the faulty store that watches every row write, simulated clocks, senders, workers and handlers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from celery_durable.engine.outbox import (
    CANCELLED,
    DUE_ADMIT,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    Admitted,
    EffectRef,
    InlineSender,
    OutboxEngine,
    OutboxSettings,
    lane_pk,
    row_id,
)
from celery_durable.engine.outbox.model import index_pk
from celery_durable.errors import StoreUnavailable
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead, Store
from harness.sim_faults import FaultSpec

__all__ = [
    "BUGS",
    "EFFECT_TYPES",
    "EPOCH",
    "FAULT_KINDS",
    "INVARIANTS",
    "LIVE",
    "MAX_SKEW",
    "SETTINGS",
    "TERMINAL",
    "Actor",
    "Faults",
    "FaultyStore",
    "Message",
    "SimClock",
    "SimLike",
    "SimResult",
    "SimSender",
    "Violation",
    "WorkerCrash",
    "audit",
    "backlog",
    "cancel_key",
    "cancel_one",
    "check_admitted",
    "check_conflict",
    "check_lane_full",
    "end_checks",
    "intents_left",
    "lane_rows",
    "maybe_expired",
    "observe",
    "order_key",
    "replay_command",
    "request_of",
]

T = TypeVar("T")

FAULT_KINDS = ("before", "after", "crash", "lose", "dup", "delay", "preempt", "skew")

INVARIANTS = {
    1: "per-key order: first claims in increasing seq; no row claimed while an earlier-seq row of its key is live",
    2: "no two handlers of one key overlap",
    3: "a process-bound (replay_safe=False) effect's handler is started at most once",
    4: "after healing every admitted effect is terminal and no intent is left un-admitted",
    5: "nothing admitted is lost (rows, intents, get/cancel find live rows, succeeded only after its handler "
    "ran, a cancel is never downgraded)",
    6: "no unexpected exception escapes",
    7: "idempotent enqueue: one row per effect id; a repeat gets created=False (same type/payload/key) or "
    "IdempotencyConflict (different), never LaneFull",
}

#: engine knobs that reintroduce a fixed bug (``OutboxEngine.bugs``): the harness must catch each
BUGS = {
    "cancel_frees_key": "D1: cancelling a running row frees its key at once, so the next row of the key "
    "can start while the cancelled handler is still running",
}

EPOCH = 1_700_000_000.0
SETTINGS = OutboxSettings(
    lease_ttl=30.0,
    heartbeat_interval=10.0,
    queue_timeout=60.0,
    retention=240.0,  # short: rows are pruned during a run, and ids reused after it
    cancel_poll=2.0,  # the keeper's beat: renew() every 2 s (it extends the lease every ~10 s)
    fast_send_max=60.0,
    admit_grace=10.0,
    max_lane_backlog=4,  # small: LaneFull happens
)
#: each clock is off by at most this (see the margin in the docstring of ``outbox_sim``)
MAX_SKEW = 4.0

#: effect type -> (replay_safe, max_attempts)
EFFECT_TYPES: dict[str, tuple[bool, int]] = {
    "email": (True, 3),
    "charge": (True, 1),
    "ship": (False, 1),
    "audit": (False, 2),  # process-bound with attempts left: still never started twice
}

LIVE = frozenset({PENDING, RUNNING})
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})


@dataclass(frozen=True)
class Faults(FaultSpec):
    """Per-call / per-delivery probabilities of each fault kind (``skew``: share of ``MAX_SKEW``)."""

    KINDS: ClassVar[tuple[str, ...]] = FAULT_KINDS

    before: float = 0.02  # the store raises StoreUnavailable before applying
    after: float = 0.02  # the store applies, then raises StoreUnavailable
    crash: float = 0.01  # the calling worker dies (before or after the call applied)
    lose: float = 0.05  # a message is lost
    dup: float = 0.05  # a message is also delivered again later
    delay: float = 0.05  # a message is held back 1..60 s (others overtake it)
    preempt: float = 0.20  # another action runs in the middle of a store call
    skew: float = 1.0  # clocks are off by up to skew * MAX_SKEW


class WorkerCrash(BaseException):  # noqa: N818 - control flow, like SystemExit
    """The simulated worker process died: unwinds whatever it was doing."""


@dataclass(frozen=True)
class Violation:
    invariant: int
    message: str
    seed: int

    def __str__(self) -> str:
        return f"seed {self.seed}: invariant {self.invariant} ({INVARIANTS[self.invariant]}): {self.message}"


@dataclass
class SimResult:
    seed: int
    faults: Faults
    bugs: tuple[str, ...]
    violations: list[Violation]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations


def replay_command(seed: int, faults: Faults, bugs: Sequence[str] = ()) -> str:
    cmd = f"python bench/outbox_sim.py --seed {seed} --faults {faults.spec()}"
    return cmd + (f" --bugs {','.join(bugs)}" if bugs else "")


@dataclass
class Message:
    ref: EffectRef
    at: float
    #: a retry after ``ClaimUnknown``: the (owner, attempt) of the claim it may take over
    adopt: tuple[tuple[str, ...], int] | None = None


class SimLike(Protocol):
    """What the parts use of the scheduler (``outbox_sim.OutboxSim``)."""

    rng: random.Random
    faults: Faults
    faults_on: bool
    bugs: frozenset[str]
    now: float
    step: int
    inner: Store
    store: FaultyStore
    pool: list[Message]
    keys: list[str]
    ran_ok: set[tuple[str, str, int]]
    pruned: set[tuple[str, str]]
    row_created: dict[str, int]
    claims: dict[str, int]
    first_claims: dict[str, tuple[Any, ...]]
    cancel_guard: set[str]
    intents: dict[str, tuple[int, str, str, bool]]

    client: Actor
    inflight: dict[str, int]
    lane_writes: dict[str, int]
    order_pks: list[str]
    created: dict[str, str]
    cancel_steps: dict[str, int]

    def actor(self) -> Actor | None: ...

    def count(self, kind: str, n: int = 1) -> None: ...

    def violate(self, invariant: int, message: str) -> None: ...

    def crash(self, actor: Actor) -> None: ...

    def maybe_preempt(self, pk: str | None) -> None: ...

    def row_of(self, effect_id: str) -> Doc | None: ...

    def note(self, text: str) -> None: ...


class SimClock:
    def __init__(self, sim: SimLike, skew: float) -> None:
        self.sim = sim
        self.skew = skew

    def now(self) -> float:
        return self.sim.now + self.skew


class SimSender:
    """The broker: every message goes to the scheduler's pool (lost/duplicated/delayed there)."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def send_effect(self, ref: EffectRef, countdown: float | None = None) -> None:
        if not self.actor.alive:
            raise WorkerCrash(self.actor.name)
        sim = self.actor.sim
        sim.pool.append(Message(ref, sim.now + (countdown or 0.0)))


class Actor:
    """A worker incarnation (``worker`` is its slot) or the client: its own engine and clock."""

    def __init__(self, sim: SimLike, name: str, skew: float, worker: int | None) -> None:
        self.sim = sim
        self.name = name
        self.skew = skew
        self.worker = worker
        self.alive = True
        self.claims = 0
        self.engine = OutboxEngine(sim.store, SimSender(self), SETTINGS, SimClock(sim, skew))
        self.engine.bugs = sim.bugs  # the engine's switches that put a fixed bug back


def order_key(doc: Doc) -> tuple[Any, ...]:
    """A row's place in its lane: its ``seq``; (created_at, id) for a row without one."""
    seq = doc.get("seq")
    if isinstance(seq, int) and not isinstance(seq, bool):
        return (0, seq, "")
    return (1, float(doc.get("created_at") or 0.0), str(doc.get("effect_id")))


def maybe_expired(row: Doc, now: float) -> bool:
    """A settled row some clock may see past its retention: its id is free again (a repeat may
    revive it, an enqueue with other parameters may take the id over)."""
    return (
        row.get("status") in (SUCCEEDED, CANCELLED)
        and row.get("due_kind") == "outbox_prune"
        and float(row.get("due_at") or 0.0) <= now + MAX_SKEW
    )


def _watched(pk: str, doc_id: str) -> bool:
    lane_doc = pk.startswith("fxq:") and (doc_id.startswith("fx:") or doc_id == "head")
    return lane_doc or doc_id.startswith("fxi:") or pk.startswith("fxid:")


class FaultyStore(Store):
    """Wraps the shared store: injects faults at every call and watches every row write (invariants
    1, 3, 5 and 7 are checked as the writes happen, against the inner store's state)."""

    def __init__(self, inner: Store, sim: SimLike) -> None:
        self.inner = inner
        self.sim = sim
        self.max_doc_bytes = inner.max_doc_bytes
        self.max_batch_ops = inner.max_batch_ops

    def _call(self, pk: str | None, fn: Callable[[], T], writes: Sequence[tuple[str, str]] | None = None) -> T:
        sim = self.sim
        actor = sim.actor()
        sim.maybe_preempt(pk)
        if actor is not None and not actor.alive:
            raise WorkerCrash(actor.name)
        crash_after = False
        if actor is not None and sim.faults_on:
            r, f = sim.rng.random(), sim.faults
            if actor.worker is not None and r < f.crash:
                if sim.rng.random() < 0.5:
                    sim.crash(actor)
                    raise WorkerCrash(actor.name)
                crash_after = True
            elif r < f.crash + f.before:
                sim.count("store_before")
                raise StoreUnavailable("injected: store unavailable (before)")
        watched = [ref for ref in writes or () if _watched(*ref)]
        before = {ref: self.inner.read(*ref) for ref in watched}
        result = fn()
        if watched:
            observe(sim, before)
        if crash_after and actor is not None:
            sim.crash(actor)
            raise WorkerCrash(actor.name)
        if writes is not None and actor is not None and sim.faults_on and sim.rng.random() < sim.faults.after:
            sim.count("store_after")
            raise StoreUnavailable("injected: store unavailable (after it applied)")
        return result

    def read(self, pk: str, doc_id: str) -> Doc | None:
        return self._call(pk, lambda: self.inner.read(pk, doc_id))

    def create(self, doc: Doc) -> str | None:
        return self._call(doc["pk"], lambda: self.inner.create(doc), [(doc["pk"], doc["id"])])

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return self._call(doc["pk"], lambda: self.inner.replace(doc, if_match), [(doc["pk"], doc["id"])])

    def upsert(self, doc: Doc) -> str:
        return self._call(doc["pk"], lambda: self.inner.upsert(doc), [(doc["pk"], doc["id"])])

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        return self._call(pk, lambda: self.inner.delete(pk, doc_id, if_match), [(pk, doc_id)])

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        # one round trip, as the backends answer it
        return self._call(pk, lambda: self.inner.read_many(pk, ids))

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        return self._call(pk, lambda: self.inner.query_partition(pk, since))

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        return self._call(pk, lambda: self.inner.batch(pk, ops), [(pk, op.doc_id) for op in ops])

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        return self._call(None, lambda: self.inner.scan_due(kind, now, limit))

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        return self.inner.scan_partitions(pk_prefix, limit)


def observe(sim: SimLike, before: dict[tuple[str, str], Doc | None]) -> None:
    """Check one applied write: each watched document before it and after it."""
    for (pk, doc_id), old in before.items():
        new = sim.inner.read(pk, doc_id)
        if pk.startswith("fxid:"):  # the id's index: traced only
            held = [
                None if d is None else (d.get("key"), d.get("effect_type"), str(d.get("digest"))[:6])
                for d in (old, new)
            ]
            sim.note(f"index {pk[5:]}: {held[0]} -> {held[1]}")
            continue
        if doc_id == "head":
            if old is not None and new is None:
                sim.note(f"head of {pk} deleted (its last row pruned): its seq may start again")
                sim.first_claims.pop(pk, None)
            continue
        if doc_id.startswith("fxi:"):
            state = None if new is None else (new.get("due_kind"), new.get("conflict"))
            sim.note(f"intent {pk}/{doc_id}: {None if old is None else old.get('due_kind')} -> {state}")
            if old is None and new is not None and isinstance(new.get("effect"), dict):
                effect = new["effect"]
                eid = str(effect["id"])
                sim.intents[eid] = (sim.step, pk, str(effect.get("key") or eid), sim.row_of(eid) is not None)
            continue
        if new is None:
            if old is not None:
                sim.note(f"row {old.get('effect_id')}@{pk[4:]}: {old.get('status')} deleted")
                _row_deleted(sim, pk, old)
            continue
        eid = str(new.get("effect_id"))
        sim.lane_writes[pk] = sim.lane_writes.get(pk, 0) + 1
        sim.note(
            f"row {eid}@{pk[4:]}: {None if old is None else old.get('status')} -> {new.get('status')} "
            f"seq {new.get('seq')} attempt {new.get('attempt')} lease {(new.get('lease') or {}).get('owner')}"
        )
        if old is None:
            _row_created(sim, pk, new)
            continue
        was, status = old.get("status"), new.get("status")
        if maybe_expired(old, sim.now) and status == PENDING and not new.get("attempt"):
            _row_created(sim, pk, new)  # revived by a repeat after its retention: a new effect
            continue
        if was in TERMINAL and status != was:
            sim.violate(5, f"row {eid} of {pk} went from {was} to {status} (reason {new.get('reason')!r})")
        if old.get("seq") != new.get("seq"):
            sim.violate(1, f"row {eid} of {pk}: seq changed from {old.get('seq')} to {new.get('seq')}")
        if was == PENDING and status == RUNNING:
            _row_claimed(sim, pk, new)
        if was == RUNNING and status == SUCCEEDED:
            attempt = (str((old.get("lease") or {}).get("owner")), eid, int(old.get("attempt") or 0))
            if attempt not in sim.ran_ok:
                sim.violate(5, f"row {eid} of {pk} succeeded but its handler (attempt {attempt}) never completed")


def _row_deleted(sim: SimLike, pk: str, old: Doc) -> None:
    eid = str(old.get("effect_id"))
    if old.get("status") in LIVE:
        sim.violate(5, f"live ({old.get('status')}) row {eid} of {pk} was deleted")
    else:
        sim.pruned.add((eid, pk))


def _row_created(sim: SimLike, pk: str, new: Doc) -> None:
    eid = str(new.get("effect_id"))
    sim.row_created[eid] = sim.step
    sim.claims[eid] = 0
    sim.pruned.discard((eid, pk))
    others = [
        k
        for k in sim.keys
        if lane_pk(k) != pk
        and (row := sim.inner.read(lane_pk(k), row_id(eid))) is not None
        and not maybe_expired(row, sim.now)
    ]
    if others:
        sim.violate(7, f"effect {eid} has a row in {pk} and in the lanes of {others}")
    if eid in sim.cancel_guard and new.get("status") != CANCELLED:
        sim.violate(5, f"effect {eid} was cancelled (cancel returned > 0) and later admitted {new.get('status')}")


def _row_claimed(sim: SimLike, pk: str, new: Doc) -> None:
    eid = str(new.get("effect_id"))
    if not (isinstance(new.get("seq"), int) and not isinstance(new.get("seq"), bool)):
        sim.violate(1, "rows have no int seq (claimed in (created_at, id) order here)")
    rows = [d for d in sim.inner.query_partition(pk).docs if str(d.get("id")).startswith("fx:")]
    mine = order_key(new)
    earlier = [
        f"{d.get('effect_id')}({d.get('status')}, seq {d.get('seq')})"
        for d in rows
        if d.get("id") != new.get("id") and d.get("status") in LIVE and order_key(d) < mine
    ]
    if earlier:
        sim.violate(1, f"{eid} (seq {new.get('seq')}) of {pk} claimed while earlier rows are live: {earlier}")
    if int(new.get("attempt") or 0) == 1:
        last = sim.first_claims.get(pk)
        if last is not None and mine < last:
            sim.violate(1, f"{eid} (seq {new.get('seq')}) of {pk} first claimed after a later row (seq {last[1]})")
        sim.first_claims[pk] = max(mine, last) if last is not None else mine
    if not new.get("replay_safe"):
        n = sim.claims[eid] = sim.claims.get(eid, 0) + 1
        if n > 1:
            sim.violate(3, f"process-bound {eid} of {pk} started a {n}th time (attempt {new.get('attempt')})")


# --- enqueues and cancels by a client, checked ---------------------------------------------------


def request_of(row: Doc) -> tuple[Any, ...]:
    """What makes two enqueues of one id the same request."""
    return (row.get("effect_type"), row.get("key"), row.get("payload"))


def check_lane_full(sim: SimLike, eid: str, key: str, pre: Doc | None, writes: int) -> None:
    """``LaneFull`` only for a new effect into a key with no room (judged only if nothing wrote the
    key's rows during the call: a settle in its middle may have made room after the engine looked)."""
    sim.count("lane_full")
    if pre is not None and sim.row_of(eid) is not None:
        sim.violate(7, f"a repeat of {eid} (row exists in {pre.get('key')}) raised LaneFull")
    elif sim.lane_writes.get(lane_pk(key), 0) == writes and (n := backlog(sim.inner, key)) < SETTINGS.max_lane_backlog:
        sim.violate(6, f"LaneFull for {eid} while key {key} has {n} live rows")


def check_conflict(sim: SimLike, eid: str, same: bool) -> None:
    """``IdempotencyConflict`` never for the very request the id's row holds."""
    sim.count("idempotency_conflict")
    row = sim.row_of(eid)
    if same and row is not None:
        index = sim.inner.read(index_pk(eid), "fx") or {}
        held = {k: index.get(k) for k in ("key", "effect_type", "digest")}
        sim.violate(
            6,
            f"IdempotencyConflict for a repeat of {eid} with the same type/payload/key as its "
            f"{row.get('status')} row (digest {row.get('digest')}); the index holds {held}",
        )


def check_admitted(sim: SimLike, eid: str, request: tuple[Any, ...], pre: Doc | None, admitted: Admitted) -> None:
    """created=True: the row is there; a repeat of a live id: created=False for the same request
    (IdempotencyConflict for another); created=False: the id's row holds this very request."""
    post = sim.inner.read(lane_pk(admitted.key), row_id(eid))
    if admitted.created:
        sim.created[eid] = admitted.key
        if post is None:
            sim.violate(5, f"enqueue of {eid} returned created=True but key {admitted.key} has no row")
    elif post is not None and not maybe_expired(post, sim.now) and request_of(post) != request:
        sim.violate(7, f"{eid} enqueued as {request}: created=False, but its row holds {request_of(post)}")
    if pre is not None and sim.row_of(eid) is not None:
        if request_of(pre) != request:
            sim.violate(
                7,
                f"{eid} enqueued again as {request} while its row is {request_of(pre)}: got {admitted}, "
                "expected IdempotencyConflict",
            )
        elif admitted.created or admitted.key != pre.get("key"):
            sim.violate(7, f"{eid} enqueued again with the same type/payload/key: got {admitted}")


# --- cancels by a client, checked --------------------------------------------------------------


def cancel_one(sim: SimLike, eid: str) -> None:
    """``cancel(id)``: > 0 leaves the row cancelled; 0 never leaves a live row untouched."""
    pre = sim.row_of(eid)
    sim.cancel_steps[eid] = sim.step
    n = sim.client.engine.cancel(eid)
    sim.count("cancels_applied", n)
    sim.note(f"cancel({eid}) -> {n}")
    post = sim.row_of(eid)
    if n > 0:
        if post is not None and post.get("status") != CANCELLED:
            sim.violate(5, f"cancel({eid}) returned {n} but the row is {post.get('status')}")
        if not sim.inflight.get(eid):
            sim.cancel_guard.add(eid)  # no later admission may bring it back to life
    elif pre is not None and post is not None and pre.get("status") in LIVE and post.get("status") in LIVE:
        sim.violate(5, f"cancel({eid}) returned 0 while its row stayed {post.get('status')}")


def cancel_key(sim: SimLike, key: str, types: list[str] | None) -> None:
    """``cancel(key=, types=)``: no row of the key (of those types) live before it stays live."""
    lane = lane_pk(key)
    pre = {d["id"]: d for d in sim.inner.query_partition(lane).docs if d.get("status") in LIVE}
    sim.cancel_steps[f"key:{key}"] = sim.step
    n = sim.client.engine.cancel(key=key, types=types)
    sim.count("cancels_applied", n)
    sim.note(f"cancel(key={key}, types={types}) -> {n}")
    for doc_id, old in pre.items():
        now = sim.inner.read(lane, doc_id)
        wanted = types is None or old.get("effect_type") in types
        if wanted and now is not None and now.get("status") in LIVE:
            sim.violate(5, f"cancel(key={key}, types={types}) left {old.get('effect_id')} {now.get('status')}")


# --- checks of the whole store (the truth: the inner store, no faults) ------------------------


def lane_rows(sim: SimLike) -> list[Doc]:
    docs = [d for k in sim.keys for d in sim.inner.query_partition(lane_pk(k)).docs]
    return [d for d in docs if str(d.get("id")).startswith("fx:")]


def intents_left(sim: SimLike) -> list[Doc]:
    """Intents still waiting for admission (a cleared one, e.g. after a conflict, does not count)."""
    docs = [d for pk in sim.order_pks for d in sim.inner.query_partition(pk).docs]
    return [d for d in docs if d.get("due_kind") == DUE_ADMIT]


def backlog(inner: Store, key: str) -> int:
    """Live rows of a key, cancelled ones still holding it, and slots kept for waiting intents."""
    docs = inner.query_partition(lane_pk(key)).docs
    held = sum(len(d.get("waiting") or []) for d in docs if d.get("id") == "head")
    rows = [d for d in docs if str(d.get("id")).startswith("fx:")]
    return held + sum(1 for d in rows if d.get("status") in LIVE or (d.get("status") == CANCELLED and d.get("lease")))


def audit(sim: SimLike) -> None:
    """Invariant 5: ``get(id)`` finds every live row."""
    reader = OutboxEngine(sim.inner, InlineSender(), SETTINGS, SimClock(sim, 0.0))
    for row in lane_rows(sim):
        if row.get("status") in LIVE:
            eid = str(row["effect_id"])
            found = reader.get(eid)
            if found is None or found.get("pk") != row.get("pk"):
                where = None if found is None else found.get("pk")
                sim.violate(5, f"get({eid}) -> {where} but its row in {row['pk']} is {row.get('status')}")


def end_checks(sim: SimLike) -> None:
    """Invariants 4 and 5 after healing."""
    live = [
        f"{r.get('effect_id')}({r.get('status')} in {r.get('pk')})" for r in lane_rows(sim) if r.get("status") in LIVE
    ]
    if live:
        sim.violate(4, f"after healing, rows still live: {live[:8]}")
    left = intents_left(sim)
    if left:
        sim.violate(4, f"after healing, intents not admitted: {[d['pk'] + '/' + d['id'] for d in left][:8]}")
    for eid, key in sim.created.items():
        if sim.inner.read(lane_pk(key), row_id(eid)) is None and (eid, lane_pk(key)) not in sim.pruned:
            sim.violate(5, f"{eid} was admitted (created=True) to {key} and its row is gone")
    for eid, (step, pk, key, existed) in sim.intents.items():
        cancelled = max(sim.cancel_steps.get(eid, -1), sim.cancel_steps.get(f"key:{key}", -1)) >= step
        if not existed and sim.row_created.get(eid, -1) < step and not cancelled:
            note = (sim.inner.read(pk, f"fxi:{eid}") or {}).get("conflict")
            sim.violate(5, f"the intent {pk}/fxi:{eid} (committed at step {step}) never became a row ({note})")
