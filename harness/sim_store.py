"""Parts of the deterministic simulation (:mod:`harness.sim`): faults, the faulty
store, simulated workers and their dispatcher.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from celery_durable.engine.activities.attempts import Attempt
from celery_durable.engine.activities.context import ActivityContext
from celery_durable.engine.core import Engine
from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.documents.model import EXEC_ID, RUNNING, TERMINAL, Settings
from celery_durable.errors import StoreUnavailable
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead, Rewrite, Store
from harness.sim_catalog import INVARIANTS, KNOWN_BUGS, OPEN_BUGS, parse_known_bugs
from harness.sim_faults import FaultSpec
from harness.sim_limits import LimitWatch
from harness.sim_pause_watch import PauseWatch
from harness.sim_sticky import StickyFaults

if TYPE_CHECKING:
    import random

    from celery_durable.engine.registry import Registry

__all__ = [
    "FAULT_KINDS",
    "INVARIANTS",
    "KNOWN_BUGS",
    "OPEN_BUGS",
    "Faults",
    "FaultyStore",
    "WorkerCrash",
    "Actor",
    "Message",
    "InFlight",
    "Planned",
    "SimResult",
    "Violation",
    "parse_known_bugs",
    "replay_command",
    "Sim",
]

FAULT_KINDS = ("before", "after", "crash", "lose", "dup", "delay", "preempt", "evict", "thread", "abandon")

EPOCH = 1_700_000_000.0
SETTINGS = Settings(
    lease_ttl=30.0,
    heartbeat_interval=10.0,
    activity_queue_timeout=60.0,
    drive_timeout=30.0,
    max_lost_attempts=1000,
    # Deterministic: the cache's age is measured with time.monotonic(), so trust it always
    # (the adversarial setting: every inline continuation starts from a possibly stale copy).
    trust_cache_for=1e9,
)
MAX_ATTEMPTS = 1000


@dataclass(frozen=True)
class Faults(FaultSpec):
    """Per-call/per-delivery probabilities of each fault kind."""

    KINDS: ClassVar[tuple[str, ...]] = FAULT_KINDS

    before: float = 0.02  # store raises StoreUnavailable before applying
    after: float = 0.02  # store applies, then raises StoreUnavailable
    crash: float = 0.01  # the calling worker crashes (before or after the call applied)
    lose: float = 0.05  # a delivered message is lost
    dup: float = 0.05  # a delivered message is also delivered again later
    delay: float = 0.05  # a message is held back 1..60 s
    preempt: float = 0.20  # another action runs in the middle of a store call
    evict: float = 0.05  # the calling worker's sticky cache evicts a live workflow instance (sim_sticky.py)
    thread: float = 0.03  # the calling worker moves to its other pool thread (other live instances)
    abandon: float = 0.5  # an operator call dies at a random store call of its operation (sim_ops.py)


NO_FAULTS = Faults.parse("none")


class WorkerCrash(BaseException):  # noqa: N818 - control flow, like SystemExit
    """The simulated worker process died: unwinds its handler (its memory is lost)."""


@dataclass(frozen=True)
class Violation:
    invariant: int
    message: str

    def __str__(self) -> str:
        return f"invariant {self.invariant} ({INVARIANTS[self.invariant]}): {self.message}"


@dataclass
class Message:
    kind: str  # drive | activity | clock
    item: Any
    at: float


class Actor:
    """A worker incarnation or a client: whoever makes the store call being simulated."""

    def __init__(self, sim: Sim, name: str, skew: float, worker: int | None, settings: Settings = SETTINGS) -> None:
        self.sim = sim
        self.name = name
        self.worker = worker  # None for clients
        self.alive = True
        self.skew = skew
        self.dispatcher = SimDispatcher(self)
        self.engine = Engine(sim.store, self.dispatcher, sim.registry, settings, SimClock(sim, skew))
        self.engine.identity = lambda: name
        # no heartbeat thread: the scheduler renews leases as one of its actions
        self.engine.heartbeat.disable()


class SimClock:
    def __init__(self, sim: Sim, skew: float) -> None:
        self.sim = sim
        self.skew = skew

    def now(self) -> float:
        return self.sim.now + self.skew


class SimDispatcher:
    """Puts everything an engine sends into the scheduler's one message pool."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    #: eager activities (``durable_eager_activities``): while a handler's commit runs, the first
    #: activity it sends is kept here, unsent, for the same worker to begin right after
    kept: list[ActivityRequest] | None = None
    #: hand-offs (``ActivityRequest.handoff``): a step granted the slot an attempt ending in this
    #: handler freed, kept to begin right after (glue/eager_activities.py ``Drain.handoff``)
    handed: list[ActivityRequest] | None = None

    def _put(self, kind: str, item: Any, at: float) -> None:
        if not self.actor.alive:
            raise WorkerCrash(self.actor.name)
        self.actor.sim.pool.append(Message(kind, item, at))

    def keeps(self, request: ActivityRequest) -> bool:
        """Asked before a commit (``Dispatcher.keeps``): the first activity a handler's commit
        sends is kept, so the commit takes its first attempt's lease."""
        return self.kept is not None and not self.kept and self.actor.alive

    def send_activity(self, request: ActivityRequest) -> None:
        if self.kept is not None and not self.kept and request.holder is not None:
            if not self.actor.alive:
                raise WorkerCrash(self.actor.name)
            self.kept.append(request)
            self.actor.sim.count("eager_kept")
            return
        if request.handoff is not None and self.hand_off(request):
            return
        self._put("activity", dc_replace(request, handoff=None), self.actor.sim.now)  # not on the wire

    def hand_off(self, request: ActivityRequest) -> bool:
        """Keep the step a slot freed here was granted to, to begin after the commit (one per
        handler, as the glue's drain keeps one)."""
        if self.handed is None or self.handed or not self.actor.alive:
            return False
        self.handed.append(request)
        self.actor.sim.count("handoff_kept")
        return True

    def eagerly(self, commit: Callable[[], object], begin: Callable[[ActivityRequest], None]) -> None:
        """``commit()`` keeping the first activity it sends, then ``begin`` it in this worker (as
        glue/eager_activities.py does). A crash loses the kept one (the window between a commit and
        the kept attempt's start: recovery re-sends it); any other error sends it, as the
        glue's drain does on its way out. A handler preempted by another on this worker (a
        thread of its own in a real worker) has a drain of its own."""
        outer, kept = self.kept, list[ActivityRequest]()
        outer_handed, handed = self.handed, list[ActivityRequest]()
        self.kept, self.handed = kept, handed
        try:
            commit()
        except WorkerCrash:
            raise  # the kept and the handed-off are lost with it: recovery and the limit's scan
        except BaseException:
            for request in kept:
                try:  # its claimed lease back first, as the glue's drain does
                    self.actor.engine.activities.unclaim(request)
                except Exception:  # noqa: BLE001 - sent all the same: recovered once the lease lapses
                    pass
                self._put("activity", request, self.actor.sim.now)
            for request in handed:
                self._put("activity", dc_replace(request, handoff=None), self.actor.sim.now)
            raise
        finally:
            self.kept, self.handed = outer, outer_handed
        if kept:  # its own workflow's step runs here: the hand-off is sent, not kept behind it
            for request in handed:
                self._put("activity", dc_replace(request, handoff=None), self.actor.sim.now)
            handed = []
        for request in kept + handed:
            begin(request)

    def send_drive(self, execution_id: str, countdown: float | None = None) -> None:
        self._put("drive", execution_id, self.actor.sim.now + (countdown or 0.0))

    def send_clock(self, request: ClockRequest) -> None:
        self._put("clock", request, request.fire_at)

    def send_effect(self, ref: Any, countdown: float | None = None) -> None:
        # the workload emits no outbox effects (see the module docstring of sim.py)
        self._put("effect", ref, self.actor.sim.now + (countdown or 0.0))


def _outcome_fp(doc: Doc) -> tuple[Any, ...]:
    err = doc.get("error") or {}
    return (
        doc.get("ok"),
        json.dumps(doc.get("value"), sort_keys=True),
        err.get("type") if isinstance(err, dict) else str(err),
        err.get("message") if isinstance(err, dict) else None,
        bool(doc.get("cancelled")),
        bool(doc.get("timeout")),
    )


def _step_of_run(doc_id: str, run: int) -> bool:
    """Whether ``doc_id`` is a marker or an outcome (``s2:000007``, ``r:000007``) of run ``run``."""
    head, sep, tail = doc_id.partition(":")
    return bool(sep) and head[:1] in ("s", "r") and head[1:] == ("" if run == 0 else str(run)) and tail.isdigit()


def _reopened(prev: Doc, doc: Doc) -> bool:
    """An operator reopened the execution (retry, resume, reset bump ``retried``), or the child
    scan revived a fence (a child id its parent's cancel claimed, never run: engine/children/holders.py) whose
    parent waits for it again."""
    revived = bool(prev.get("fence")) and not prev.get("drives") and not doc.get("fence")
    return revived or int(doc.get("retried") or 0) > int(prev.get("retried") or 0)


def _exec_fp(doc: Doc) -> tuple[Any, ...]:
    err = doc.get("error") or {}
    return (doc.get("status"), json.dumps(doc.get("result"), sort_keys=True), err.get("type"), err.get("message"))


class FaultyStore(Store):
    """Wraps the shared store: injects faults per call and watches every write (invariants 2, 3, 4, 7)."""

    def __init__(self, inner: Store, sim: Sim) -> None:
        self.inner = inner
        self.sim = sim
        self.max_doc_bytes = inner.max_doc_bytes
        self.max_batch_ops = inner.max_batch_ops
        self._outcomes: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._live_results: dict[tuple[str, str], bool] = {}
        self._execs: dict[str, Doc] = {}
        self._leases: dict[tuple[str, str], dict[str, Any]] = {}
        #: per marker: its token and the heartbeat details last recorded (invariant 12)
        self._beats: dict[tuple[str, str], tuple[Any, int]] = {}
        self._sticky = StickyFaults(sim.seed)
        #: outcomes deleted by a batch that recorded no operation (invariant 8)
        self._cut: set[tuple[str, str]] = set()
        #: every write of a limit document (invariant 13, sim_limits.py)
        self.limits = LimitWatch(sim)
        #: every write of an exec or a step marker, in the store's order (invariant 14, sim_pause.py)
        self.pauses = PauseWatch(sim)

    # --- the fault point ----------------------------------------------------------------

    def _call(
        self,
        pk: str | None,
        write: bool,
        fn: Callable[[], Any],
        observe: Callable[[Any], None] | None = None,
        doc: Doc | None = None,
    ) -> Any:
        sim = self.sim
        actor = sim.actor()
        sim.maybe_preempt(pk)
        if sim.faults_on:
            shaken = self._sticky.shake(actor, sim.faults)
            if shaken is not None:
                sim.count(shaken)
        if actor is not None and not actor.alive:
            raise WorkerCrash(actor.name)
        crash_after = False
        if actor is not None and sim.faults_on:
            r = sim.rng.random()
            f = sim.faults
            if actor.worker is not None and r < f.crash:
                if sim.rng.random() < 0.5:
                    sim.crash(actor)
                    raise WorkerCrash(actor.name)
                crash_after = True
            elif r < f.crash + f.before and (actor.worker is not None or sim.client_faults):
                sim.count("store_before")
                raise StoreUnavailable("injected: store unavailable (before)")
        result = fn()
        if write and observe is not None:
            observe(result)
        if crash_after and actor is not None:
            sim.crash(actor)
            raise WorkerCrash(actor.name)
        after = write and actor is not None and sim.faults_on and sim.rng.random() < sim.faults.after
        if after and actor is not None and (actor.worker is not None or sim.client_faults):
            sim.count("store_after")
            raise StoreUnavailable("injected: store unavailable (after it applied)")
        return result

    # --- observation ----------------------------------------------------------------------

    def _written(self, doc: Doc, created: bool) -> None:
        pk, did = str(doc["pk"]), str(doc["id"])
        kind = doc.get("type")
        self.pauses.written(doc, created)
        if kind in ("result", "signal"):
            fp = _outcome_fp(doc)
            old = self._outcomes.get((pk, did))
            if old is not None and old != fp:
                self.sim.violate(2, f"{pk}/{did} changed from {old} to {fp}")
            self._outcomes.setdefault((pk, did), fp)
            if created and self._live_results.get((pk, did)):
                self.sim.violate(4, f"{pk}/{did} was created twice")
            if created and (pk, did) in self._cut:
                self.sim.violate(8, f"{pk}/{did} ran again after a batch that recorded no operation deleted it")
            self._live_results[(pk, did)] = True
        if doc.get("type") == "step" or did == EXEC_ID:
            self._check_lease(pk, did, doc)
        if kind == "limit" or did == EXEC_ID:  # a limit document, an execution (invariant 13, sim_limits.py)
            self.limits.written(doc)
        beat = doc.get("heartbeat") if doc.get("type") == "step" else None
        if isinstance(beat, dict) and isinstance(beat.get("details"), int):
            token, details = doc.get("token"), beat["details"]
            old = self._beats.get((pk, did))
            if old is not None and old[0] == token and details < old[1]:
                self.sim.violate(12, f"{pk}/{did}: heartbeat details went back from {old[1]} to {details}")
            self._beats[(pk, did)] = (token, details)
        if did == EXEC_ID:
            prev = self._execs.get(pk)
            if created and doc.get("parent"):
                link = doc["parent"]
                parent = self._execs.get(str(link.get("pk")))
                if parent is None or parent.get("status") != RUNNING or int(parent.get("run") or 0) != link.get("run"):
                    state = None if parent is None else (parent.get("status"), parent.get("run"))
                    self.sim.violate(7, f"child {pk} created for {link} while the parent is {state}")
            if prev is not None and not _reopened(prev, doc):
                if prev.get("cancel_requested") and not doc.get("cancel_requested"):
                    self.sim.violate(3, f"{pk}: cancel_requested went true -> false")
                for k in ("run", "drives", "wakeups", "signal_seq", "continued"):
                    if int(doc.get(k) or 0) < int(prev.get(k) or 0):
                        self.sim.violate(3, f"{pk}: lost update, {k} went from {prev.get(k)} to {doc.get(k)}")
                if prev.get("status") in TERMINAL and _exec_fp(prev) != _exec_fp(doc):
                    self.sim.violate(3, f"{pk}: terminal {_exec_fp(prev)} became {_exec_fp(doc)}")
            self._execs[pk] = dict(doc)
            if doc.get("dedup_key") is not None and doc.get("status") == RUNNING:
                key = doc["dedup_key"]
                holders = sorted(
                    p
                    for p, ex in self._execs.items()
                    if ex.get("dedup_key") == key and ex.get("status") == RUNNING and not ex.get("cancel_requested")
                )
                if len(holders) > 1:
                    self.sim.violate(10, f"dedup key {key!r} held by {len(holders)} running executions: {holders}")

    def _rewrite(self, pk: str, ops: Sequence[Op]) -> None:
        """Invariant 8 on a batch deleting documents of an execution it keeps: the execution is
        reopened by it, or it records the rest (``pending_op``); deletes it does not record as an
        operator's forget no step may record again."""
        gone = [op.doc_id for op in ops if op.kind == "delete" and op.doc_id != EXEC_ID]
        ex = next((op.doc for op in ops if op.doc_id == EXEC_ID and op.doc is not None), None)
        if not gone or ex is None:
            return
        prev = self._execs.get(pk) or {}
        pending = isinstance(ex.get("pending_op"), dict) or bool(ex.get("purging"))
        current = [d for d in gone if _step_of_run(d, int(ex.get("run") or 0))]  # not a pruned old run
        if current and ex.get("status") in TERMINAL and not pending:
            left = f"left it {ex.get('status')} with nothing recording the operation"
            self.sim.violate(8, f"{pk}: a batch deleted {current} (run {ex.get('run')}), {left}")
        if isinstance(ex.get("pending_op"), dict) and not isinstance(prev.get("pending_op"), dict):
            self.sim.count("ops_pending_written")
        by_op = pending or _reopened(prev, ex) or ex.get("last_op") != prev.get("last_op")
        for did in gone:
            if by_op:  # forgotten by the operation: the re-run records it anew
                self._outcomes.pop((pk, did), None)
            else:
                self._cut.add((pk, did))

    def _check_lease(self, pk: str, did: str, doc: Doc) -> None:
        """A lease live beyond any clock skew is never taken over by another holder."""
        old = self._leases.get((pk, did)) or {}
        new = doc.get("lease") or {}
        self._leases[(pk, did)] = new
        holder, expires = old.get("holder"), float(old.get("expires") or 0.0)
        if holder and new.get("holder") and new.get("holder") != holder and expires > self.sim.now + 1.0:
            self.sim.violate(
                4, f"{pk}/{did}: {new['holder']} took the lease {holder} holds for {expires - self.sim.now:.1f}s more"
            )

    def _deleted(self, pk: str, doc_id: str) -> None:
        self._live_results.pop((pk, doc_id), None)
        self.pauses.deleted(pk, doc_id)
        if doc_id == EXEC_ID:  # purged (a forgotten child): a new execution may take its id
            self._execs.pop(pk, None)
            for key in [k for k in self._outcomes if k[0] == pk]:
                del self._outcomes[key]

    # --- the Store API --------------------------------------------------------------------

    def read(self, pk: str, doc_id: str) -> Doc | None:
        return self._call(pk, False, lambda: self.inner.read(pk, doc_id))  # type: ignore[no-any-return]

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        return self._call(pk, False, lambda: self.inner.read_many(pk, ids))  # type: ignore[no-any-return]

    def create(self, doc: Doc) -> str | None:
        def observe(etag: Any) -> None:
            if etag is not None:
                self._written(doc, True)

        return self._call(doc["pk"], True, lambda: self.inner.create(doc), observe, doc)  # type: ignore[no-any-return]

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return self._call(  # type: ignore[no-any-return]
            doc["pk"], True, lambda: self.inner.replace(doc, if_match), lambda _: self._written(doc, False), doc
        )

    def upsert(self, doc: Doc) -> str:
        return self._call(  # type: ignore[no-any-return]
            doc["pk"], True, lambda: self.inner.upsert(doc), lambda _: self._written(doc, False)
        )

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        return self._call(  # type: ignore[no-any-return]
            pk, True, lambda: self.inner.delete(pk, doc_id, if_match), lambda _: self._deleted(pk, doc_id)
        )

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        return self._call(pk, False, lambda: self.inner.query_partition(pk, since))  # type: ignore[no-any-return]

    def batch_observed(self, pk: str, ops: Sequence[Op]) -> None:
        """Watch the writes of a batch that applied."""
        self._rewrite(pk, ops)
        self.pauses.begin()  # one write: its own exec counts for the writes after it
        for op in ops:
            if op.kind == "delete":
                self._deleted(pk, op.doc_id)
            elif op.doc is not None:
                self._written(op.doc, op.kind == "create")
        self.pauses.end(pk)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        return self._call(  # type: ignore[no-any-return]
            pk, True, lambda: self.inner.batch(pk, ops), lambda _: self.batch_observed(pk, ops)
        )

    @property
    def cross_partition(self) -> bool:  # type: ignore[override]
        return self.inner.cross_partition

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        """As :meth:`batch`, faults before and after; the rewritten documents (what each ``update``
        returned last, PostgreSQL may call it again) are watched as writes once the call applied."""
        for rewrite in also:
            rewrite.etag = None
        bodies: list[tuple[Doc, bool] | None] = [None] * len(also)

        def remembering(j: int, rewrite: Rewrite) -> Callable[[Doc | None], Doc | None]:
            def update(doc: Doc | None) -> Doc | None:
                new = rewrite.update(doc)
                bodies[j] = None if new is None else (dict(new), doc is None)
                return new

            return update

        inner = [Rewrite(r.pk, r.id, remembering(j, r)) for j, r in enumerate(also)]

        def call() -> list[str | None]:
            out = self.inner.batch_with(pk, ops, inner)
            for rewrite, done in zip(also, inner, strict=True):
                rewrite.etag = done.etag
            return out

        def observe(result: Any) -> None:
            self.batch_observed(pk, ops)
            for done, body in zip(inner, bodies, strict=True):
                if done.etag is not None and body is not None:  # a write of its own partition
                    self._written(*body)

        try:
            return self._call(pk, True, call, observe)  # type: ignore[no-any-return]
        except BaseException:  # a failure after it applied too: the caller learns no etag
            for rewrite in also:
                rewrite.etag = None
            raise

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        return self._call(None, False, lambda: self.inner.scan_due(kind, now, limit))  # type: ignore[no-any-return]

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        return self.inner.scan_partitions(pk_prefix, limit)

    def list_execs(self, flt: Any = None, limit: int = 100, cursor: str | None = None) -> Any:
        # a batch's page (sim_pause.py)
        return self._call(None, False, lambda: self.inner.list_execs(flt, limit, cursor))


@dataclass
class InFlight:
    actor: Actor
    attempt: Attempt
    request: ActivityRequest
    #: its heartbeat context (engine/activities/context.py): the renewals tell it to stop
    ctx: ActivityContext | None = None
    #: the progress it sent with its last heartbeat (the sim's heartbeat details)
    progress: int = 0


@dataclass
class Planned:
    """One workflow of the workload and what clients did to it."""

    eid: str
    workflow: str
    args: list[Any]
    started: bool = False
    cancel_sent: bool = False
    accepted: list[str] = field(default_factory=list)  # signal tokens: signal() returned True
    uncertain: list[str] = field(default_factory=list)  # signal() raised: may or may not be recorded
    doubtful: list[str] = field(default_factory=list)  # sent again after a raise: may be recorded twice
    timing: Any = None  # options(timeout=, start_delay=): a deadlines.Timing (sim_deadlines.py)


@dataclass
class SimResult:
    seed: int
    faults: Faults
    known_bugs: tuple[str, ...]
    violations: list[Violation]
    stats: dict[str, int]
    workflows: int
    #: violations with the signature of an open bug whose flag is off: (bug, violation)
    tolerated: list[tuple[str, Violation]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def replay_command(seed: int, faults: Faults, known_bugs: Sequence[str] = ()) -> str:
    cmd = f"python -m tests.sim.run --seed {seed} --faults {faults.spec()}"
    return cmd + f" --known-bugs {','.join(known_bugs) or 'none'}"


class Sim(Protocol):
    """What the store, the actors and the checks use of the scheduler (``sim.Sim``): typed here so
    that ``sim`` imports these modules and never the other way round."""

    seed: int
    rng: random.Random
    faults: Faults
    faults_on: bool
    client_faults: bool
    now: float
    inner: Store
    store: FaultyStore
    registry: Registry
    pool: list[Message]
    plan: list[Planned]

    def actor(self) -> Actor | None: ...

    def count(self, kind: str, n: int = 1) -> None: ...

    def violate(self, invariant: int, message: str, bug: str | None = None) -> None: ...

    def crash(self, actor: Actor) -> None: ...

    def maybe_preempt(self, pk: str | None) -> None: ...

    def _execs(self) -> dict[str, Doc]: ...
