"""Deterministic simulation of the effect outbox (issue 11): many seeds, faults, invariants.

One seed is one run: ``random.Random(seed)`` is the only source of randomness; there are no
threads, no sleeps and no wall-clock time. Three simulated workers and one client (each its own
:class:`~celery_durable.engine.outbox.OutboxEngine` and skewed clock) share one in-memory store
wrapped by :class:`~.outbox_sim_parts.FaultyStore`, which fails calls before or after they
applied, kills the calling worker, and may *preempt* a call to run another action in its middle
(a delivery, a scan, an enqueue or cancel, a heartbeat: what other threads and processes do).
Every message goes to one pool that loses, duplicates, delays and reorders it.

A handler is not run by ``runtime.execute`` (real threads) but modelled on a worker as the
runtime runs it: claim (a fresh claim runs without a pre-check) → *running* until its end time,
while the keeper renews the lease every ``cancel_poll`` sim-seconds as time passes (a renew that
answers ``cancelled`` or ``lost`` stops it at once) → settle with the outcome the seed chose
(success, retryable failure settled ``retry`` with a delay and re-sent with that countdown,
non-retryable ``failed``), half the time claiming the key's next row in the same batch
(``claim_next``, which then runs at once), and falling back as ``runtime._execute`` does when
the store fails. A handler stopped by a cancel calls ``release()`` (its key was held until
then); one that lost its lease records nothing. A process-bound (``replay_safe=False``) effect
never asks for a retry.

Clock-skew margin: each clock is off by at most ``MAX_SKEW`` = 4 s, so two clocks differ by at
most 8 s. The keeper renews every ``cancel_poll`` = 2 s and extends the lease once less than
``lease_ttl - heartbeat_interval`` = 20 s is left, so a lease always has more than 18 s left by
its holder's clock; another clock sees it expire no sooner than 10 s later, i.e. after five
failed renewals in a row (< 1e-7 per extension here). Skews up to ``(lease_ttl -
heartbeat_interval - cancel_poll) / 2`` would be safe without store faults; larger skews make
an expiry while the holder runs *expected* (no engine can tell), so they are not simulated.

The fault phase (enqueues direct and through transactional intents whose enqueuer may die
before admitting them, repeated ids with the same or a different payload, cancels by id and by
key, scans from skewed clocks) is followed by a healing phase: faults off, every message
delivered, scans run and time advanced past leases and retries until nothing is left. The
invariants (:data:`~.outbox_sim_parts.INVARIANTS`) are checked as writes happen and at the end;
a failing seed prints one command that replays it exactly.

    python bench/outbox_sim.py --seed 1234 [--faults all|none|before,after,...] [--bugs cancel_frees_key]
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery_durable.engine.outbox import (
    DUE_ADMIT,
    DUE_LANE,
    FAILED,
    RETRY,
    SUCCEEDED,
    Claim,
    ClaimUnknown,
    LaneFull,
    lane_pk,
    row_id,
)
from celery_durable.errors import IdempotencyConflict, StoreUnavailable
from celery_durable.stores.base import Doc, Op, Store
from celery_durable.stores.memory import MemoryStore
from harness.outbox_sim_parts import (
    BUGS,
    EFFECT_TYPES,
    EPOCH,
    FAULT_KINDS,
    INVARIANTS,
    LIVE,
    MAX_SKEW,
    SETTINGS,
    Actor,
    Faults,
    FaultyStore,
    Message,
    SimResult,
    Violation,
    WorkerCrash,
    audit,
    cancel_key,
    cancel_one,
    check_admitted,
    check_conflict,
    check_lane_full,
    end_checks,
    intents_left,
    lane_rows,
    maybe_expired,
    replay_command,
    request_of,
)
from harness.sim_faults import quiet

__all__ = [
    "BUGS",
    "FAULT_KINDS",
    "INVARIANTS",
    "Faults",
    "OutboxSim",
    "SimResult",
    "Violation",
    "check_seed",
    "replay_command",
    "run_seed",
]

ACTIONS = (("deliver", 30), ("finish", 14), ("time", 14), ("client", 14), ("scan", 6), ("beat", 3))
NESTED = ("deliver", "finish", "client", "scan", "beat")
CLIENT_OPS = (("new", 30), ("intent", 20), ("repeat", 10), ("cancel", 4), ("cancel_key", 1))
FAULT_STEPS = 300
HEAL_STEPS = 1500
AUDIT_EVERY = 25


@dataclass
class Handler:
    """One attempt of a handler on a worker: runs until ``ends_at`` unless stopped earlier."""

    worker: Actor
    claim: Claim
    outcome: str  # succeeded | retry | failed, chosen by the seed
    delay: float  # of a retry
    ends_at: float
    next_beat: float
    n: int
    #: why it stopped before its end: cancelled | lost
    stop: str | None = None
    #: inside renew()/settle() of this claim (its lock is held: no nested beat or finish of it)
    busy: bool = False

    @property
    def key(self) -> str:
        return self.claim.key

    def active(self, now: float) -> bool:
        """Its user code is running (from the claim until it ended, stopped or crashed)."""
        return self.stop is None and now < self.ends_at


class OutboxSim:
    """One seeded run of a random outbox workload against the real outbox engine."""

    def __init__(
        self,
        seed: int,
        faults: Faults = Faults(),
        bugs: Sequence[str] = (),
        store: Store | None = None,
        trace: list[str] | None = None,
    ) -> None:
        unknown = [b for b in bugs if b not in BUGS]
        if unknown:
            raise ValueError(f"unknown bugs {unknown}; known: {', '.join(BUGS)}")
        self.seed = seed
        self.trace = trace  # what happened, line by line (a replay with --trace)
        self.rng = rng = random.Random(seed)
        self.faults = faults
        self.faults_on = False
        self.bugs = frozenset(bugs)
        self.now = EPOCH
        self.step = 0
        self.inner = store if store is not None else MemoryStore()
        self.store = FaultyStore(self.inner, self)
        self.pool: list[Message] = []
        self.handlers: list[Handler] = []
        self.stack: list[Actor] = []
        self.depth = 0
        self.stats: dict[str, int] = {}
        self.violations: list[Violation] = []
        self.keys = [f"k{i}" for i in range(rng.randint(1, 3))]
        self.budget = rng.randint(8, 28)  # new effect ids this seed
        skews = [rng.uniform(-MAX_SKEW, MAX_SKEW) * faults.skew for _ in range(4)]
        self.workers = [Actor(self, f"w{i}.1", skews[i], i) for i in range(3)]
        self.incarnations = [1, 1, 1]
        self.client = Actor(self, "client", skews[3], None)
        self.effects: list[str] = []
        self.order_pks: list[str] = []
        self.retries: list[tuple[int, Callable[[], None]]] = []
        self.inflight: dict[str, int] = {}  # enqueue calls of an id in progress
        self.n_handlers = 0
        # what the checks need (see outbox_sim_parts.observe)
        self.ran_ok: set[tuple[str, str, int]] = set()  # (owner, id, attempt) of handlers that succeeded
        self.pruned: set[tuple[str, str]] = set()  # (id, lane) of rows deleted once settled
        self.row_created: dict[str, int] = {}
        self.claims: dict[str, int] = {}
        self.first_claims: dict[str, tuple[Any, ...]] = {}
        self.cancel_guard: set[str] = set()  # cancelled (> 0) with no enqueue of the id since
        self.intents: dict[str, tuple[int, str, str, bool]] = {}  # committed: (step, pk, key, row existed)
        self.created: dict[str, str] = {}  # created=True admissions: id -> key
        self.lane_writes: dict[str, int] = {}  # row writes by lane
        self.cancel_steps: dict[str, int] = {}  # id or "key:<k>" -> last step a cancel was issued

    # --- hooks used by the store and the actors -----------------------------------------

    def note(self, text: str) -> None:
        if self.trace is not None:
            who = self.stack[-1].name if self.stack else "-"
            self.trace.append(f"{self.step:4d} t={self.now - EPOCH:7.1f} {'  ' * self.depth}{who}: {text}")

    def actor(self) -> Actor | None:
        return self.stack[-1] if self.stack else None

    def count(self, kind: str, n: int = 1) -> None:
        self.stats[kind] = self.stats.get(kind, 0) + n

    def violate(self, invariant: int, message: str) -> None:
        v = Violation(invariant, f"{message} (step {self.step}, t={self.now - EPOCH:.1f})", self.seed)
        self.note(f"VIOLATION {v}")
        if all((o.invariant, o.message.split(" (step ")[0]) != (invariant, message) for o in self.violations):
            self.violations.append(v)

    def crash(self, actor: Actor) -> None:
        """The worker process dies: its handlers stop at once, their leases lapse."""
        if not actor.alive or actor.worker is None:
            return
        actor.alive = False
        self.count("crash")
        self.note(f"CRASH of {actor.name}")
        self.handlers = [h for h in self.handlers if h.worker is not actor]
        i = actor.worker
        self.incarnations[i] += 1
        self.workers[i] = Actor(self, f"w{i}.{self.incarnations[i]}", actor.skew, i)

    def maybe_preempt(self, pk: str | None) -> None:
        """Maybe run another action in the middle of a store call, most often on the same key."""
        if not self.faults_on or self.depth >= 2 or not self.stack or self.rng.random() >= self.faults.preempt:
            return
        self.count("preempt")
        self.depth += 1
        try:
            key = pk[4:] if pk is not None and pk.startswith("fxq:") and self.rng.random() < 0.7 else None
            self.act(self.rng.choice(NESTED), key)
        finally:
            self.depth -= 1

    def row_of(self, effect_id: str) -> Doc | None:
        for k in self.keys:
            row = self.inner.read(lane_pk(k), row_id(effect_id))
            if row is not None:
                return row
        return None

    # --- actions ------------------------------------------------------------------------

    def act(self, action: str, key: str | None = None) -> None:
        rng = self.rng
        if action == "deliver":
            self._deliver(key)
        elif action in ("finish", "beat"):
            if action == "finish":
                ready = [h for h in self.handlers if not h.busy and not h.active(self.now)]
            else:
                ready = [h for h in self.handlers if not h.busy]
            mine = [h for h in ready if h.key == key]
            if ready:
                h = rng.choice(mine or ready)
                if action == "finish":
                    self.run_as(h.worker, "settle", self._finish, h)
                else:
                    self.run_as(h.worker, "heartbeat", self._beat, h)
        elif action == "time":
            self.advance(self.now + (rng.uniform(0.0, 3.0) if rng.random() < 0.9 else rng.uniform(20.0, 70.0)))
        elif action == "client":
            self._client_op(key)
        elif action == "scan":
            w = rng.choice(self.workers)
            limit = rng.choice([2, 10, 500])
            self.run_as(w, "scan", w.engine.scan, limit)

    def run_as(self, actor: Actor, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Run one action as ``actor``; a crash or a store error ends it as it would a task."""
        self.stack.append(actor)
        try:
            fn(*args)
        except WorkerCrash:
            self.crash(actor)
        except StoreUnavailable:
            self.count("store_error_seen")
        except Exception as exc:
            self.violate(6, f"{what} on {actor.name} raised {type(exc).__name__}: {exc}")
        finally:
            self.stack.pop()

    def advance(self, to: float) -> None:
        """Let time pass; the keepers beat on their schedule on the way (they never skip a beat)."""
        while True:
            due = [h for h in self.handlers if not h.busy and h.next_beat <= to]
            if not due:
                break
            h = min(due, key=lambda x: (x.next_beat, x.n))
            self.now = max(self.now, h.next_beat)
            self.run_as(h.worker, "heartbeat", self._beat, h)
        self.now = max(self.now, to)

    def _deliver(self, key: str | None = None) -> None:
        rng = self.rng
        ready = [i for i, m in enumerate(self.pool) if m.at <= self.now]
        if key is not None:
            ready = [i for i in ready if self.pool[i].ref.key == key] or ready
        if not ready:
            return
        m = self.pool.pop(rng.choice(ready))
        if self.faults_on:
            r = rng.random()
            if r < self.faults.lose:
                self.count("lost")
                return
            if r < self.faults.lose + self.faults.delay:
                self.count("delayed")
                self.pool.append(Message(m.ref, self.now + rng.uniform(1.0, 60.0)))
                return
            if rng.random() < self.faults.dup:
                self.count("duplicated")
                self.pool.append(Message(m.ref, self.now + rng.uniform(0.0, 20.0), m.adopt))
        self.count("delivered")
        w = rng.choice(self.workers)
        self.run_as(w, "delivery", self._handle, w, m)

    def _handle(self, w: Actor, m: Message) -> None:
        """The handler task: claim, then run (or re-send itself, as Celery's task.retry)."""
        w.claims += 1
        owner = f"{w.name}/{w.claims}"
        try:
            result = w.engine.claim(m.ref.key, m.ref.effect_id, owner=owner, after=m.ref.after, adopt=m.adopt)
        except ClaimUnknown as exc:  # as Outbox.deliver: the retry adopts the claim if it applied
            self.count("claims_unknown")
            if w.alive:
                self.pool.append(Message(m.ref, self.now + 1.0, (exc.owners, exc.attempt)))
            return
        except StoreUnavailable:
            self._send(w, m, 1.0)
            return
        if result.claim is None:
            if result.reason == "early" and result.wait <= SETTINGS.fast_send_max:
                self._send(w, m, result.wait)
            return
        self._start(w, result.claim)

    def _start(self, w: Actor, claim: Claim) -> None:
        """A claimed row's handler starts (the claim is fresh: the runtime runs it without a check)."""
        rng = self.rng
        for other in self.handlers:
            if other.key == claim.key and other.active(self.now):
                self.violate(
                    2,
                    f"{claim.effect_id} (attempt {claim.attempt}) of key {claim.key} started on {w.name} while "
                    f"{other.claim.effect_id} (attempt {other.claim.attempt}) runs on {other.worker.name}",
                )
        r = rng.random()
        if claim.replay_safe:
            outcome = SUCCEEDED if r < 0.6 else RETRY if r < 0.85 else FAILED
        else:
            outcome = SUCCEEDED if r < 0.75 else FAILED
        if outcome == RETRY and claim.attempt >= claim.max_attempts:
            outcome = FAILED
        delay = rng.choice([0.0, rng.uniform(1.0, 20.0), rng.uniform(30.0, 90.0)])
        length = rng.uniform(0.2, 5.0) if rng.random() < 0.8 else rng.uniform(20.0, 90.0)
        self.n_handlers += 1
        h = Handler(w, claim, outcome, delay, self.now + length, self.now + SETTINGS.cancel_poll, self.n_handlers)
        self.handlers.append(h)
        self.count("effects_run")
        self.note(f"handler {claim.effect_id}#{claim.attempt} starts ({outcome}, until t={h.ends_at - EPOCH:.1f})")

    def _send(self, w: Actor, m: Message, countdown: float) -> None:
        if w.alive:
            self.pool.append(Message(m.ref, self.now + countdown, m.adopt))

    def _beat(self, h: Handler) -> None:
        """One beat of the keeper for this handler: renew; cancelled or lost stops it."""
        h.next_beat = self.now + SETTINGS.cancel_poll
        h.busy = True
        try:
            state = h.worker.engine.renew(h.claim)
        except StoreUnavailable:
            state = "error"  # the keeper beats again; the lease may still be ours then
        finally:
            h.busy = False
        if state in ("cancelled", "lost") and h.active(self.now):
            self.count(f"stopped_{state}")
            h.stop = state
            h.ends_at = self.now
            if state == "lost" and h in self.handlers:
                self.handlers.remove(h)

    def _finish(self, h: Handler) -> None:
        """The handler has returned (or stopped): settle as ``runtime._execute`` does."""
        claim, eng, w = h.claim, h.worker.engine, h.worker
        h.busy = True
        try:
            if h.stop == "cancelled":
                self.count(f"settled_{eng.release(claim)}")  # the key was held until now (D1)
                return
            verb, error = h.outcome, None if h.outcome == SUCCEEDED else "RuntimeError: injected"
            if verb == SUCCEEDED:
                self.ran_ok.add((claim.owner, claim.effect_id, claim.attempt))
            delay = h.delay if verb == RETRY else 0.0
            # half the settles also claim the key's next row for this worker (it runs every type)
            successors = list(EFFECT_TYPES) if verb != RETRY and self.rng.random() < 0.5 else []
            try:
                kind = eng.settle(claim, verb, error=error, delay=delay, claim_next=successors)
            except StoreUnavailable as exc:
                requeue = claim.replay_safe if verb == SUCCEEDED else verb == RETRY
                text = f"settle failed: StoreUnavailable: {exc}"
                delay = 0.0
                try:
                    kind = eng.settle(claim, RETRY if requeue else FAILED, error=text, reason=None if requeue else text)
                except StoreUnavailable:
                    kind = "unsettled"  # the lease lapses and the scan decides
            self.count(f"settled_{kind}")
            self.note(f"handler {claim.effect_id}#{claim.attempt} settled {verb}: {kind}")
            if kind == RETRY:
                self._send(w, Message(claim.ref, self.now), delay)
        finally:
            h.busy = False
            if h in self.handlers:
                self.handlers.remove(h)
        if claim.successor is not None and w.alive:
            self.count("successors")
            self._start(w, claim.successor)

    # --- the client -----------------------------------------------------------------------

    def _client_op(self, key: str | None = None, retry_only: bool = False) -> None:
        """One call of a client: a retry of a call that failed, or a new enqueue or cancel."""
        rng = self.rng
        due = [i for i, (step, _) in enumerate(self.retries) if step <= self.step or retry_only]
        if due:
            op = self.retries.pop(due[0])[1]
        else:
            ops = [(o, w) for o, w in CLIENT_OPS if self.effects or o in ("new", "intent")]
            if len(self.effects) >= self.budget:
                ops = [(o, w) for o, w in ops if o not in ("new", "intent")]
            kind = rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
            op = self._make_op(kind, key)
        self.stack.append(self.client)
        try:
            op()
        except StoreUnavailable:
            self.count("client_error")
            if rng.random() < 0.5:  # the caller retries the same call later
                self.retries.append((self.step + rng.randint(1, 20), op))
        except Exception as exc:
            self.violate(6, f"a client call raised {type(exc).__name__}: {exc}")
        finally:
            self.stack.pop()

    def _make_op(self, kind: str, key: str | None) -> Callable[[], None]:
        rng = self.rng
        if kind in ("new", "intent"):
            eid = f"e{len(self.effects)}"
            self.effects.append(eid)
            etype = rng.choice(list(EFFECT_TYPES))
            r = rng.random()
            at = None if r < 0.7 else self.now + (rng.uniform(0.0, 30.0) if r < 0.9 else rng.uniform(61.0, 150.0))
            new: tuple[Any, ...] = (
                eid,
                etype,
                key or rng.choice(self.keys),
                {"n": len(self.effects)},
                at,
                kind == "intent",
            )
            return lambda: self._enqueue(*new)
        if kind == "repeat":
            eid = rng.choice(self.effects)
            row = self.row_of(eid)
            etype = str(row["effect_type"]) if row else rng.choice(list(EFFECT_TYPES))
            k = str(row["key"]) if row else rng.choice(self.keys)
            payload = row.get("payload") if row else {"n": int(eid[1:]) + 1}
            change = rng.choice(["", "", "", "payload", "type", "key"])
            if change == "payload":
                payload = {"n": -1}
            elif change == "type":
                etype = rng.choice([t for t in EFFECT_TYPES if t != etype])
            elif change == "key" and len(self.keys) > 1:
                k = rng.choice([x for x in self.keys if x != k])
            again: tuple[Any, ...] = (eid, etype, k, payload, None, rng.random() < 0.3)
            return lambda: self._enqueue(*again)
        if kind == "cancel":
            eid = rng.choice(self.effects)
            return lambda: cancel_one(self, eid)
        k = key or rng.choice(self.keys)
        types = None if rng.random() < 0.7 else [rng.choice(list(EFFECT_TYPES))]
        return lambda: cancel_key(self, k, types)

    def _enqueue(self, eid: str, etype: str, key: str, payload: Any, at: float | None, transactional: bool) -> None:
        eng, rng = self.client.engine, self.rng
        replay_safe, max_attempts = EFFECT_TYPES[etype]
        body = eng.effect_body(
            etype, payload, key=key, effect_id=eid, available_at=at, replay_safe=replay_safe, max_attempts=max_attempts
        )
        pre = self.row_of(eid)
        if pre is not None and maybe_expired(pre, self.now):
            pre = None  # its id may be free again: no expectation
        request = (etype, key, payload)
        same = pre is not None and request_of(pre) == request
        writes = self.lane_writes.get(lane_pk(key), 0)
        self.cancel_guard.discard(eid)
        self.inflight[eid] = self.inflight.get(eid, 0) + 1
        self.count("enqueue_intent" if transactional else "enqueue_direct")
        self.note(f"enqueue {eid} {etype} key {key} {payload} at {at} {'intent' if transactional else 'direct'}")
        try:
            if transactional:
                pk = f"orders:{len(self.order_pks)}"
                self.order_pks.append(pk)
                intent = eng.intent(pk, body)
                if rng.random() < 0.7:  # Outbox.enqueue(with_docs=): refused before the caller commits
                    eng.check_admissible(body)  # (Outbox.enqueue_ops + the caller's batch: not)
                eng.store.batch(pk, [Op.create({"pk": pk, "id": "order", "type": "order"}), Op.create(intent)])
                if rng.random() < 0.3:
                    self.count("enqueuer_died")  # before admitting: the scan admits it after admit_grace
                    return
                found = eng.admit_intent(intent)
                if found is None:  # an IdempotencyConflict: the intent is cleared, the first enqueue stands
                    raise IdempotencyConflict(f"intent of {eid} not admitted")
                admitted = found
            else:
                admitted = eng.admit(body)
        except LaneFull:
            check_lane_full(self, eid, key, pre, writes)
            return
        except IdempotencyConflict:
            check_conflict(self, eid, same)
            return
        finally:
            self.inflight[eid] -= 1
        check_admitted(self, eid, request, pre, admitted)

    # --- the run ------------------------------------------------------------------------

    def run(self) -> SimResult:
        names = [a for a, _ in ACTIONS]
        weights = [w for _, w in ACTIONS]
        self.faults_on = self.faults != Faults.parse("none")
        for self.step in range(FAULT_STEPS):
            self.act(self.rng.choices(names, weights)[0])
            if self.step % AUDIT_EVERY == AUDIT_EVERY - 1:
                audit(self)
        audit(self)
        self.faults_on = False
        self._heal()
        end_checks(self)
        return SimResult(self.seed, self.faults, tuple(sorted(self.bugs)), self.violations, self.stats)

    def _heal(self) -> None:
        """Faults off: deliver, finish, scan and let time pass until nothing is left to do."""
        rng = self.rng
        for self.step in range(FAULT_STEPS, FAULT_STEPS + HEAL_STEPS):
            if self.retries:
                self._client_op(retry_only=True)
                continue
            if any(m.at <= self.now for m in self.pool):
                self._deliver()
                continue
            done = [h for h in self.handlers if not h.active(self.now)]
            if done:
                h = done[0]
                self.run_as(h.worker, "settle", self._finish, h)
                continue
            w = rng.choice(self.workers)
            sent = len(self.pool)
            self.run_as(w, "scan", w.engine.scan, 500)
            if len(self.pool) != sent:
                continue
            live = [r for r in lane_rows(self) if r.get("status") in LIVE]
            if not live and not self.handlers and not self.pool and not intents_left(self):
                return
            # on to the next thing due, late enough for every skewed clock to see it due
            nxt = [m.at for m in self.pool] + [h.ends_at for h in self.handlers]
            for kind in (DUE_ADMIT, DUE_LANE):
                nxt += [ref.due_at + 2 * MAX_SKEW + 0.01 for ref in self.inner.scan_due(kind, float("inf"), 1)]
            future = [t for t in nxt if t > self.now]
            self.advance(max(self.now + 1.0, min(future)) if future else self.now + SETTINGS.lease_ttl)


def run_seed(
    seed: int,
    faults: Faults = Faults(),
    bugs: Sequence[str] = (),
    store: Store | None = None,
    trace: list[str] | None = None,
) -> SimResult:
    with quiet():
        return OutboxSim(seed, faults, bugs, store=store, trace=trace).run()


def check_seed(seed: int, faults: Faults = Faults(), bugs: Sequence[str] = ()) -> SimResult:
    """Run one seed; raise AssertionError naming the seed, the invariants and the replay command."""
    result = run_seed(seed, faults, bugs)
    if result.violations:
        lines = "\n".join(f"  {v}" for v in result.violations[:10])
        raise AssertionError(f"{result.violations[0]}\n{lines}\nreplay: {replay_command(seed, faults, bugs)}")
    return result
