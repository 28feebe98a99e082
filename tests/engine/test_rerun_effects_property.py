"""Issue 23 item 2, as a property: random workflows with emits (default ids, explicit ids with the
same or another payload, compensations), a random sequence of operator operations (reset, resume,
retry, cancel) and crashes (a worker dying between a drive's commit and the admission of its
intents; an intent admitted twice). Invariant: every emit of the final run is enqueued exactly
once or reported not admitted with a reason; no effect id is reused for another payload."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, NonRetryableError, WorkflowCancelledError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin, OperationRefused
from celery_durable.glue.outbox import effect_context
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("rerun-effects-property", set_as_current=False)
durable = Durable(app, store="memory://")
RAN: list[tuple[str, str]] = []  # (effect id, payload token) of each run of the effect
BROKEN: set[str] = set()
SEEDS = 400


@durable.effect("rp.note", replay_safe=True)
def note(payload: dict[str, str]) -> None:
    RAN.append((effect_context().effect_id, payload["tok"]))


@durable_activity(name="rp.act")
def act(name: str) -> str:
    if name in BROKEN:
        raise NonRetryableError(f"{name} is broken")
    return name


def _emit(kind: str, arg: int, tag: str = "") -> str:
    if kind == "same":  # an explicit id, the same payload whenever it is taken
        return durable.emit("rp.note", {"tok": f"same-{arg}"}, effect_id=f"same-{arg}")
    tok = f"{tag}{wf.uuid4()}"
    if kind == "diff":  # an explicit id, another payload each take
        return durable.emit("rp.note", {"tok": tok}, effect_id=f"diff-{arg}")
    return durable.emit("rp.note", {"tok": tok})


@durable.workflow(name="rp.random", signals={"go": str})
def random_workflow(plan: list[list[Any]]) -> int:
    for op, arg in plan:
        if op in ("emit", "same", "diff"):
            _emit(op, arg)
        elif op == "act":
            act(f"a{arg}")
        elif op == "comp":  # a Saga step: its failure is compensated by an emit, then raised
            try:
                act(f"a{arg}")
            except Exception:
                _emit("emit", arg, "comp-")
                raise
        elif op == "wait":
            try:
                wf.wait_signal("go")
            except WorkflowCancelledError:
                _emit("emit", arg, "cancel-")
                raise
    return len(plan)


def _plan(rng: random.Random) -> list[list[Any]]:
    ops = ["emit", "emit", "same", "diff", "act", "comp", "wait"]
    return [[rng.choice(ops), rng.randrange(3)] for _ in range(rng.randint(2, 7))]


def _emit_markers(env: WorkflowEnvironment, pk: str) -> list[dict[str, Any]]:
    return [d for d in env.store.query_partition(pk).docs if d.get("type") == "step" and d.get("kind") == "emit"]


def _crashy(env: WorkflowEnvironment, rng: random.Random) -> None:
    """A worker that dies between the commit and the admission (the intent waits for the scan
    or the operation's own admission), or admits the same intent twice (a redelivery)."""
    eng = env.engine
    admit, admit_intent = eng._admit, eng.outbox.admit_intent

    def crashing(req: Any) -> None:
        if rng.random() < 0.3:
            return
        doc = env.store.read(req.execution_id, req.doc_id)
        if doc is not None and doc.get("due_kind") and rng.random() < 0.3:
            admit_intent(dict(doc))  # the same intent, twice, from the same read
            admit_intent(dict(doc))
            return
        admit(req)

    eng._admit = crashing  # type: ignore[method-assign]


def run_seed(seed: int) -> list[str]:
    """Play one seed; return the invariant's violations."""
    rng = random.Random(seed)
    RAN.clear()
    BROKEN.clear()
    BROKEN.update(f"a{i}" for i in range(3) if rng.random() < 0.6)
    env = WorkflowEnvironment(durable)
    _crashy(env, rng)
    admin = Admin(env.engine)
    h = env.start(random_workflow, _plan(rng))
    seen: dict[str, set[str]] = {}  # effect id -> payload tokens of intents admitted under it

    def settle() -> None:
        env.run_until_idle()
        env.advance(60)
        env.advance(60)
        for m in _emit_markers(env, h.id):
            if m.get("admitted") is True:
                seen.setdefault(m["effect"]["id"], set()).add(m["effect"]["payload"]["tok"])

    for _ in range(rng.randint(1, 6)):
        settle()
        status = h.status()
        if status == "completed":
            break
        for i in range(3):  # the operator fixes (or breaks) things between operations
            if rng.random() < 0.4:
                BROKEN.symmetric_difference_update({f"a{i}"})
        try:
            if status == "running":
                if rng.random() < 0.5:
                    env.cancel(h)
                else:
                    env.signal(h, "go", "now")
            elif status == "failed":
                what = rng.choice(["reset", "retry", "resume"])
                if what == "reset":
                    steps = int(env.store.read(h.id, "exec")["steps"])  # type: ignore[index]
                    h.reset(step=rng.randint(1, steps + 1))
                else:
                    getattr(admin, what)(h.id)
            elif status == "cancelled":
                if rng.random() < 0.5:
                    admin.resume(h.id)
                else:
                    steps = int(env.store.read(h.id, "exec")["steps"])  # type: ignore[index]
                    h.reset(step=rng.randint(1, steps + 1))
        except OperationRefused:
            pass
    settle()
    bad: list[str] = []
    ran = Counter(RAN)
    bad += [f"effect {eid} ({tok}) ran {n} times" for (eid, tok), n in ran.items() if n > 1]
    bad += [f"effect id {eid} ran with {n} payloads" for eid, n in Counter(e for e, _ in ran).items() if n > 1]
    bad += [f"effect id {eid} admitted for payloads {sorted(t)}" for eid, t in seen.items() if len(t) > 1]
    for m in _emit_markers(env, h.id):
        eff, where = m["effect"], f"step {m['seq']} ({m['effect']['id']})"
        row = env.engine.outbox.get(eff["id"])
        if "admitted" not in m:
            bad.append(f"{where}: never admitted")
        elif m["admitted"] is True:
            if row is None or row["payload"] != eff["payload"]:
                bad.append(f"{where}: reported enqueued, the row holds {None if row is None else row['payload']}")
            elif (n := ran[(eff["id"], eff["payload"]["tok"])]) != 1:
                bad.append(f"{where}: enqueued but ran {n} times")
        elif eff["id"].startswith(h.id):
            bad.append(f"{where}: a default id not admitted ({m.get('reason') or m.get('conflict')})")
        elif m.get("reason") not in ("duplicate", "conflict"):
            bad.append(f"{where}: not admitted without a reason: {m}")
        elif (m["reason"] == "duplicate") != (row is not None and row["payload"] == eff["payload"]):
            bad.append(f"{where}: reason {m['reason']} but the row holds {None if row is None else row['payload']}")
    return bad


@pytest.mark.parametrize("chunk", range(4))
def test_every_emit_of_the_final_run_is_enqueued_once_or_told(chunk: int) -> None:
    failures = {}
    for seed in range(chunk, SEEDS, 4):
        bad = run_seed(seed)
        if bad:
            failures[seed] = bad
    assert not failures, f"{len(failures)} seeds violate: " + "; ".join(f"{s}: {b}" for s, b in failures.items())
