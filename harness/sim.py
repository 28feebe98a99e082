"""Deterministic simulation testing (DST) of the workflow engine (issue 10 §3).

One seed is one run: ``random.Random(seed)`` is the only source of randomness; there are no
threads, no sleeps and no wall-clock time. Several simulated workers (each its own
:class:`~celery_durable.engine.Engine`, partition cache, identity and skewed clock) share one
in-memory store wrapped by :class:`FaultyStore`. Every message (drive, activity, clock) goes to
one pool owned by the scheduler, which delivers it to a random worker and loses, duplicates,
delays or reorders it. Activities run in two steps (begin, then body + outcome) so other work
interleaves with them; their leases are renewed by a scheduled heartbeat action.

Interleaving without threads: at any store call the scheduler may *preempt* the caller and run a
whole other action (a delivery, a scan, a client's signal or cancel, possibly on the same
worker, as a second pool thread would) before the call goes on, so the engine's read→write
windows are exercised as under real concurrency.

A fault phase is followed by a healing phase (faults off, time jumping to whatever is due) until
nothing is left; then the invariants (:data:`INVARIANTS`) are checked. A failing seed prints one
command that replays it exactly. Emitted outbox effects are not simulated: today the outbox is
admitted through a thread-local note and a Celery-layer listener, and runs its own heartbeat
thread.

    python -m tests.sim.run --seed 1234 [--faults all|none|before,after,crash,...]
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from celery_durable.engine.activities.delivery import Delivery
from celery_durable.engine.documents.model import (
    DUE_ACTIVITY,
    DUE_CHILD,
    DUE_CLOCK,
    DUE_EXEC,
    EXEC_ID,
    TERMINAL,
    marker_id,
)
from celery_durable.errors import NonRetryableError, StoreError, StoreUnavailable
from celery_durable.stores.base import Doc, Store
from celery_durable.stores.memory import MemoryStore
from harness.sim_checks import Outcome, check, outcome_of
from harness.sim_deadlines import check_enforced
from harness.sim_faults import quiet
from harness.sim_heartbeats import beat, check_stops, stopped
from harness.sim_limits import check_begun, limit_work, plan_limited
from harness.sim_ops import plan_ops
from harness.sim_store import (
    EPOCH,
    FAULT_KINDS,
    INVARIANTS,
    KNOWN_BUGS,
    MAX_ATTEMPTS,
    NO_FAULTS,
    SETTINGS,
    Actor,
    Faults,
    FaultyStore,
    InFlight,
    Message,
    Planned,
    SimResult,
    Violation,
    WorkerCrash,
    parse_known_bugs,
    replay_command,
)
from harness.sim_workload import LONG_TIMEOUT, SIGNAL_TIMEOUT, ActivityLedger, build_registry, set_ledger

__all__ = [
    "FAULT_KINDS",
    "INVARIANTS",
    "KNOWN_BUGS",
    "Faults",
    "FaultyStore",
    "WorkerCrash",
    "Sim",
    "SimResult",
    "Violation",
    "run_seed",
    "check_seed",
    "parse_known_bugs",
    "replay_command",
]

ACTIONS = (("deliver", 40), ("finish", 16), ("time", 14), ("recovery", 5), ("clocks", 5), ("heartbeat", 6))
NESTED = ("deliver", "drive", "dup", "finish", "recovery", "clocks", "client")
FAULT_STEPS = 200
HEAL_STEPS = 600
DUE_KINDS = (DUE_EXEC, DUE_ACTIVITY, DUE_CLOCK, DUE_CHILD, "limit")

#: fault-free outcome of (workflow, args): computed once per process
_REFERENCE: dict[str, Outcome] = {}


class Sim:
    """One seeded run of the workload against the real engine."""

    def __init__(
        self,
        seed: int,
        faults: Faults = Faults(),
        known_bugs: Sequence[str] = (),
        workers: int = 3,
        store: Store | None = None,
        only: tuple[str, list[Any]] | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults
        self.faults_on = False
        self.known_bugs = tuple(known_bugs)
        self.now = EPOCH
        self.inner = store if store is not None else MemoryStore()
        self.store = FaultyStore(self.inner, self)
        self.registry = build_registry()
        self.pool: list[Message] = []
        self.inflight: list[InFlight] = []
        self.handling: list[Message] = []  # messages whose handler is on the stack
        self.stack: list[Actor] = []
        self.depth = 0
        self.stats: dict[str, int] = {}
        self.violations: list[Violation] = []
        self.tolerated: list[tuple[str, Violation]] = []
        self.ledger = ActivityLedger()
        self.incarnations = [1] * workers
        self.workers = [Actor(self, f"w{i}.1", self.rng.uniform(-0.4, 0.4), i) for i in range(workers)]
        # odd seeds start eagerly: the client drives each first step itself (durable_eager_start)
        self.client = Actor(self, "client", 0.0, None, settings=replace(SETTINGS, eager_start=seed % 2 == 1))
        #: seeds 2 and 3 (mod 4): workers run the first activity a commit sends themselves, unsent
        self.eager_activities = seed % 4 >= 2
        self.plan: list[Planned] = []
        self.ops: list[tuple[int, int, Callable[[], None]]] = []  # (step, order, op)
        self.step = 0
        self.reference = only is not None
        #: whether the client's store calls see faults (off inside signal() unless
        #: KNOWN_BUGS["signal_error_after_write"] is on)
        self.client_faults = True
        plan_ops(self, only)  # _make_plan, then operators' calls (sim_ops.py)
        plan_limited(self)  # fan-outs under keyed limits and a rate (sim_limits.py)

    # --- hooks used by the store and the actors -----------------------------------------

    def actor(self) -> Actor | None:
        return self.stack[-1] if self.stack else None

    def count(self, kind: str, n: int = 1) -> None:
        self.stats[kind] = self.stats.get(kind, 0) + n

    def violate(self, invariant: int, message: str, bug: str | None = None) -> None:
        """Record a violation; one with the signature of open bug ``bug`` (flag off) is tolerated."""
        v = Violation(invariant, message)
        if bug is not None and bug not in self.known_bugs:
            if (bug, v) not in self.tolerated:
                self.tolerated.append((bug, v))
        elif v not in self.violations:
            self.violations.append(v)

    def crash(self, actor: Actor) -> None:
        """The worker process dies: its memory (engine, cache, running attempts) is gone."""
        if not actor.alive or actor.worker is None:
            return
        actor.alive = False
        self.count("crash")
        self.inflight = [f for f in self.inflight if f.actor is not actor]
        i = actor.worker
        self.incarnations[i] += 1
        self.workers[i] = Actor(self, f"w{i}.{self.incarnations[i]}", actor.skew, i)

    def maybe_preempt(self, pk: str | None) -> None:
        """Maybe run another action in the middle of a store call, most often one on the same
        execution (that is where races are)."""
        if not self.faults_on or self.depth >= 2 or not self.stack or self.rng.random() >= self.faults.preempt:
            return
        self.count("preempt")
        self.depth += 1
        try:
            if pk is not None and self.rng.random() < 0.7:
                self.act(self.rng.choice(self._work_on(pk)), pk)
            else:
                self.act(self.rng.choice(NESTED))
        finally:
            self.depth -= 1

    def _work_on(self, pk: str) -> list[str]:
        """Nested actions that would touch ``pk`` now (a spurious drive at least)."""
        work = limit_work(self, pk) or ["drive", "recovery"]
        if any(_target(m) == pk and m.at <= self.now for m in self.pool):
            work += ["deliver", "deliver"]
        if any(_target(m) == pk for m in self.pool + self.handling) or any(
            f.request.execution_id == pk for f in self.inflight
        ):
            work.append("dup")
        if any(f.request.execution_id == pk for f in self.inflight):
            work += ["finish", "finish"]
        if any(getattr(op, "eid", None) == pk for _, _, op in self.ops):
            work.append("client")
        return work

    # --- the workload -------------------------------------------------------------------

    def _make_plan(self, only: tuple[str, list[Any]] | None) -> None:
        rng = self.rng
        if only is not None:
            self._add(f"ref-{only[0]}", only[0], only[1], cancel=False, signals=0)
            return
        kinds = ["w_seq", "w_fan", "w_timer", "w_signal", "w_parent", "w_saga", "w_counter"]
        kinds += [rng.choice(kinds) for _ in range(rng.randint(0, 3))]
        if "child_after_continue" in self.known_bugs:
            kinds.append("w_generations")
        for i, kind in enumerate(kinds):
            args: list[Any]
            signals, cancel = 0, 0.3
            if kind == "w_seq":
                args = [rng.randint(2, 4)]
            elif kind == "w_fan":
                args = [rng.randint(2, 5), f"k{i}"]
            elif kind == "w_timer":
                args = [rng.choice([5.0, 20.0, 45.0])]
            elif kind == "w_signal":
                rounds = rng.randint(1, 3) if "signal_vs_continue" in self.known_bugs else 1
                args = [rounds, [], SIGNAL_TIMEOUT if "signal_timeout_race" in self.known_bugs else LONG_TIMEOUT]
                signals, cancel = rng.randint(0, args[0] + 1), 0.0
            elif kind == "w_parent":
                args = [[rng.randint(0, 3) for _ in range(rng.randint(1, 3))]]
                cancel = 0.3 if "cancel_parent" in self.known_bugs else 0.0
            elif kind == "w_saga":
                # every other one with an input too large to ride in the exec (its own document);
                # chosen without the rng, so each seed's other choices stay what they were
                args, cancel = [f"i{i}" + ("-" * 700 if (self.seed + i) % 2 else "")], 0.6
            elif kind == "w_counter":
                args = [rng.randint(1, 3), 0, "stale_run_release" in self.known_bugs]
                if (self.seed + i) % 2:
                    args.append("p" * 2400)  # large, then halved each run: 1200, 600 (own), 300 (inline)
            else:
                args = [0]
            self._add(f"s{self.seed}-{i}-{kind}", kind, args, cancel=rng.random() < cancel, signals=signals)

    def _add(self, eid: str, kind: str, args: list[Any], cancel: bool, signals: int) -> None:
        rng = self.rng
        p = Planned(eid, kind, args)
        self.plan.append(p)
        start = rng.randint(0, FAULT_STEPS // 3)
        self._op(start, _ClientOp(eid, lambda: self._start(p)))
        if cancel:
            self._op(rng.randint(start + 1, FAULT_STEPS), _ClientOp(eid, lambda: self._cancel(p)))
        for j in range(signals):
            token = f"{eid}#{j}"
            self._op(rng.randint(start, FAULT_STEPS), _ClientOp(eid, lambda token=token: self._signal(p, token)))  # type: ignore[misc]

    def _op(self, step: int, op: Callable[[], None]) -> None:
        self.ops.append((step, len(self.ops), op))
        self.ops.sort(key=lambda o: (o[0], o[1]))

    def _start(self, p: Planned) -> None:
        definition = self.registry.workflow(p.workflow)
        assert definition is not None
        self.client.engine.start(definition, tuple(p.args), {}, workflow_id=p.eid, timing=p.timing)
        p.started = True

    def _cancel(self, p: Planned) -> None:
        if not p.started:
            raise _NotStarted
        p.cancel_sent = True  # even if the call fails: it may have been recorded
        self.client.engine.cancel(p.eid)

    def _signal(self, p: Planned, token: str) -> None:
        if not p.started:
            raise _NotStarted
        # uncertain until signal() answers; sent again after a raise, it may be recorded twice
        (p.doubtful if token in p.uncertain else p.uncertain).append(token)
        self.client_faults = "signal_error_after_write" in self.known_bugs
        try:
            accepted = self.client.engine.signal(p.eid, "tick", token)
        finally:
            self.client_faults = True
        if accepted:
            p.accepted.append(token)
            p.uncertain.remove(token)

    def _client_op(self, due_only: bool, pk: str | None = None) -> bool:
        """Run the next client operation (postponed while its execution is not started); with
        ``pk``, the next one for that execution, however early."""
        for k, (step, _order, op) in enumerate(self.ops):
            if due_only and step > self.step:
                return False
            if pk is not None and getattr(op, "eid", pk) != pk:
                continue
            del self.ops[k]
            self.stack.append(self.client)
            try:
                op()
            except StoreError:
                self.count("client_retry")
                self._op(self.step + self.rng.randint(1, 10), op)
            except _NotStarted:
                self._op(self.step + self.rng.randint(1, 10), op)
            except Exception as exc:
                self.violate(0, f"a client call raised {type(exc).__name__}: {exc}")
            finally:
                self.stack.pop()
            return True
        return False

    # --- actions ------------------------------------------------------------------------

    def act(self, action: str, pk: str | None = None) -> None:
        """Run one action; with ``pk``, prefer work on that execution."""
        rng = self.rng
        if action == "deliver":
            self._deliver(pk)
        elif action == "finish":
            mine = [f for f in self.inflight if f.request.execution_id == pk]
            if mine or self.inflight:
                fl = rng.choice(mine or self.inflight)
                self.inflight.remove(fl)
                self.run_as(fl.actor, "activity body", lambda: self._eager(fl.actor, lambda: self._finish(fl)))
        elif action == "drive" and pk is not None:  # a spurious drive, as a duplicate message makes
            w = rng.choice([w for w in self.workers if w not in self.stack] or self.workers)
            self.run_as(w, "drive", lambda: w.engine.drive(pk))
        elif action == "dup" and pk is not None:  # a duplicate of a message for pk, delivered now
            known = [m for m in self.pool + self.handling if _target(m) == pk]
            known += [Message("activity", f.request, self.now) for f in self.inflight if f.request.execution_id == pk]
            m = rng.choice(known) if known else None
            receivers = self._receivers(m) if m is not None else []
            if m is not None and receivers:
                self.count("duplicated")
                w = rng.choice(receivers)
                self.run_as(w, m.kind, lambda: self._handle(w, m))
        elif action == "time":
            self.now += rng.uniform(0.0, 3.0) if rng.random() < 0.9 else rng.uniform(20.0, 70.0)
        elif action == "heartbeat":
            w = rng.choice(self.workers)
            told = beat(self, w)  # its attempts heartbeat their progress (harness/sim_heartbeats.py)
            self.run_as(w, "heartbeat", w.engine.leases.renew_all)
            check_stops(self, w, told)
        elif action == "recovery":
            w = rng.choice(self.workers)
            self.run_as(w, "recovery scan", w.engine.recovery.scan)
        elif action == "clocks":
            w = rng.choice(self.workers)
            self.run_as(w, "clock scan", w.engine.timers.fire_due_clocks)
        elif action == "client":
            self._client_op(due_only=False, pk=pk)

    def run_as(self, actor: Actor, what: str, fn: Callable[[], object]) -> None:
        """Run one handler on a worker; a crash or a store error ends it as it would a task."""
        self.stack.append(actor)
        try:
            fn()
        except WorkerCrash:
            self.crash(actor)
        except StoreError:
            self.count("handler_store_error")
        except Exception as exc:
            self.violate(0, f"{what} raised {type(exc).__name__}: {exc}")
        finally:
            self.stack.pop()

    def _deliver(self, pk: str | None = None) -> None:
        rng = self.rng
        ready = [i for i, m in enumerate(self.pool) if m.at <= self.now]
        if pk is not None:
            ready = [i for i in ready if _target(self.pool[i]) == pk] or ready
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
                m.at = self.now + rng.uniform(1.0, 60.0)
                self.pool.append(m)
                return
            if rng.random() < self.faults.dup:
                self.count("duplicated")
                self.pool.append(Message(m.kind, m.item, self.now + rng.uniform(0.0, 20.0)))
        receivers = self._receivers(m)
        if not receivers:  # every worker is busy with this step: try again a little later
            m.at = self.now + 1.0
            self.pool.append(m)
            return
        self.count("delivered")
        w = rng.choice(receivers)
        self.run_as(w, m.kind, lambda: self._handle(w, m))

    def _receivers(self, m: Message) -> list[Actor]:
        if m.kind != "activity" or "same_process_duplicate" in self.known_bugs:
            return self.workers
        req = m.item
        key = (req.execution_id, req.run, req.seq)
        # not to a worker running it already, nor to one in the middle of a call (a preempted begin)
        busy = [f.actor for f in self.inflight if (f.request.execution_id, f.request.run, f.request.seq) == key]
        busy += self.stack
        return [w for w in self.workers if w not in busy]

    def _handle(self, w: Actor, m: Message) -> None:
        self.handling.append(m)
        try:
            self._handle_message(w, m)
        finally:  # by identity: an equal copy (a duplicate) may be handled at the same time
            del self.handling[next(i for i, h in enumerate(self.handling) if h is m)]

    def _handle_message(
        self, w: Actor, m: Message, claimed: str | None = None, handoff: tuple[str, int, str | None] | None = None
    ) -> None:
        eng = w.engine
        if m.kind == "drive":
            self._eager(w, lambda: eng.drive(str(m.item)))
        elif m.kind == "clock":
            self._eager(w, lambda: eng.timers.fire_clock(m.item.execution_id, m.item.seq, m.item.run))
        elif m.kind == "effect":
            self.count("effects_ignored")
        else:
            req = m.item
            before = self.inner.read(req.execution_id, marker_id(req.seq, req.run)) or {}
            lease = before.get("lease") or {}
            try:
                # claimed: a kept activity's lease its commit took (never a message's)
                delivery = Delivery.of_request(req)
                attempt, _why = eng.activities.begin(
                    req.execution_id, req.seq, req.run, None, delivery, claimed, handoff
                )
            except StoreUnavailable:
                self._resend(w, req, 2.0)  # the Celery glue retries the task
                return
            if attempt is None:
                return
            key = (req.execution_id, req.run, req.seq)
            live = float(lease.get("expires") or 0.0) > self.now + 1.0
            for f in self.inflight:
                same = (f.request.execution_id, f.request.run, f.request.seq) == key
                if same and f.actor is w and live and lease.get("holder") == f.attempt.holder:
                    self.violate(4, f"{w.name} runs two attempts of {key} at once (the lease holder is the process)")
            act = eng.registry.activity(req.name)
            ctx = eng.activities.context(attempt, act.options if act is not None else None)
            self.inflight.append(InFlight(w, attempt, req, ctx))
            check_begun(self, attempt)  # invariant 13 (a): at most max_running of a key (sim_limits.py)

    def _eager(self, w: Actor, commit: Callable[[], object]) -> None:
        if not self.eager_activities:
            commit()
            return

        def begin(req: Any) -> None:  # a kept activity, or a hand-off (its grant: never a message's)
            self._handle_message(w, Message("activity", req, self.now), req.holder, req.grant())

        w.dispatcher.eagerly(commit, begin)

    def _resend(self, w: Actor, req: Any, countdown: float) -> None:
        if w.alive:
            self.pool.append(Message("activity", req, self.now + countdown))

    def _finish(self, fl: InFlight) -> None:
        eng, req, attempt = fl.actor.engine, fl.request, fl.attempt
        if stopped(self, fl):  # told to stop by a renewal: it raised ActivityCancelled
            return
        act = eng.registry.activity(req.name)
        assert act is not None
        args, kwargs = act.codec.decode_args({"args": req.args, "kwargs": req.kwargs})
        self.count("bodies")
        try:
            try:
                with fl.ctx or nullcontext():  # current(), as in the glue: the library's batch pages use it
                    value = act.codec.encode_result(act.fn(*args, **kwargs))
            except Exception as exc:
                if attempt.number < MAX_ATTEMPTS and not isinstance(exc, NonRetryableError):
                    countdown = self.rng.uniform(0.0, 5.0)
                    eng.activities.retrying(attempt, countdown, exc)
                    self._resend(fl.actor, req, countdown)
                    return
                # as the glue does (glue/durable_activity.py): a failure for good is recorded
                # without a replay, Celery reports it, then after_return drives the workflow on;
                # that drive is a message here, so a lost one (a crash) is recovery's to make up
                # (no hand-off here: the failure is reported first; a slot it frees is sent)
                eng.activities.complete(attempt, eng.activities.result_doc(attempt, error=exc), defer=True)
                fl.actor.dispatcher.send_drive(req.execution_id)
                return
            # as the glue does: the completion's drive keeps its next activity, and a slot it
            # frees is handed off here (glue/eager_activities.py)
            done = eng.activities.result_doc(attempt, value=value)
            self._eager(fl.actor, lambda: eng.activities.complete(attempt, done))
        except StoreUnavailable:
            self._resend(fl.actor, req, 2.0)

    # --- the run ------------------------------------------------------------------------

    def run(self) -> SimResult:
        set_ledger(self.ledger)
        names = [a for a, _ in ACTIONS]
        weights = [w for _, w in ACTIONS]
        self.faults_on = self.faults != NO_FAULTS
        for self.step in range(FAULT_STEPS):
            while self._client_op(due_only=True):
                pass
            self.act(self.rng.choices(names, weights)[0])
        self.faults_on = False
        self._heal()
        if not self.reference:
            check(self, reference_outcome)
        return SimResult(
            self.seed, self.faults, self.known_bugs, self.violations, self.stats, len(self.plan), self.tolerated
        )

    def _heal(self) -> None:
        rng = self.rng
        for self.step in range(FAULT_STEPS, FAULT_STEPS + HEAL_STEPS):
            if self._client_op(due_only=False):
                continue
            if any(m.at <= self.now for m in self.pool):
                self._deliver()
                continue
            if self.inflight:
                self.act("finish")
                continue
            if not self._running():
                return
            due = [m.at for m in self.pool]
            for kind in DUE_KINDS:
                found = self.inner.scan_due(kind, float("inf"), 1)
                due += [found[0].due_at] if found else []
            if not due:
                return  # stuck: reported by invariant 5
            self.now = max(self.now + 1.0, min(due) + 1.0)
            w = rng.choice(self.workers)
            self.run_as(w, "recovery scan", w.engine.recovery.scan)
            self.run_as(w, "clock scan", w.engine.timers.fire_due_clocks)
            check_enforced(self, w)  # invariant 11: every deadline past is enforced (sim_deadlines.py)

    def _execs(self) -> dict[str, Doc]:
        out: dict[str, Doc] = {}
        for pk in self.inner.scan_partitions("", 1_000_000):
            doc = self.inner.read(pk, EXEC_ID)
            if doc is not None:
                out[pk] = doc
        return out

    def _running(self) -> bool:
        return any(d.get("status") not in TERMINAL or d.get("pending_op") for d in self._execs().values())


class _NotStarted(Exception):
    pass


class _ClientOp:
    """A client's call on one execution (callable; ``eid`` lets preemption pick it)."""

    def __init__(self, eid: str, fn: Callable[[], None]) -> None:
        self.eid = eid
        self.fn = fn

    def __call__(self) -> None:
        self.fn()


def _target(m: Message) -> str:
    if m.kind == "drive":
        return str(m.item)
    return str(getattr(m.item, "execution_id", ""))


def reference_outcome(workflow: str, args: list[Any]) -> Outcome:
    """The outcome of a fault-free run of ``workflow(*args)`` (cached per process)."""
    key = json.dumps([workflow, args])
    if key not in _REFERENCE:
        sim = Sim(0, NO_FAULTS, only=(workflow, args))
        with quiet():
            sim.run()
        ex = sim.inner.read(f"ref-{workflow}", EXEC_ID)
        _REFERENCE[key] = outcome_of(ex) if ex is not None else ("missing",)
    return _REFERENCE[key]


def run_seed(
    seed: int, faults: Faults = Faults(), known_bugs: Sequence[str] = (), store: Store | None = None
) -> SimResult:
    with quiet():
        return Sim(seed, faults, known_bugs, store=store).run()


def check_seed(seed: int, faults: Faults = Faults(), known_bugs: Sequence[str] = ()) -> SimResult:
    """Run one seed; raise AssertionError naming the seed, the invariant and the replay command."""
    result = run_seed(seed, faults, known_bugs)
    if result.violations:
        lines = "\n".join(f"  {v}" for v in result.violations[:10])
        raise AssertionError(
            f"seed {seed}: {result.violations[0]}\n{lines}\nreplay: {replay_command(seed, faults, known_bugs)}"
        )
    return result
