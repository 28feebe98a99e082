"""The outbox simulation with the read-ahead hints attacked (``OutboxSim`` unchanged otherwise).

On top of :class:`~.outbox_sim.OutboxSim`'s faults: enqueues through ``admit_many`` (whose wake-up
message names the rows after the first, ``EffectRef.after``), and messages whose hints are forged
or stale -- ``after`` naming ids of any key in any order (read ahead by the claim, used blind by the
settles of its drain), and adopt headers of an earlier ``ClaimUnknown`` attached to other messages,
other rows or another attempt. The invariants are the simulation's own. A separate class keeps the
base simulation's random streams (and its regression seeds) as they were.

    python -c "from harness.outbox_sim_forge import main; main()" 500
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from celery_durable.engine.outbox import EffectRef
from celery_durable.errors import IdempotencyConflict, LaneFull
from harness.outbox_sim import OutboxSim
from harness.outbox_sim_parts import EFFECT_TYPES, Faults, Message, SimResult, check_admitted
from harness.sim_faults import quiet

__all__ = ["ForgingSim", "run_forged"]


class ForgingSim(OutboxSim):
    #: (owners, attempt) of every ClaimUnknown retry seen: replayed on other messages
    adopts: list[tuple[tuple[str, ...], int]]

    def _deliver(self, key: str | None = None) -> None:
        rng = self.rng
        if not hasattr(self, "adopts"):
            self.adopts = []
        self.adopts += [m.adopt for m in self.pool if m.adopt is not None and m.adopt not in self.adopts]
        if self.faults_on and self.pool and rng.random() < 0.4:
            i = rng.randrange(len(self.pool))
            m = self.pool[i]
            after = m.ref.after
            r = rng.random()
            if r < 0.3:  # any ids, of any key, shuffled
                after = tuple(rng.sample(self.effects, min(len(self.effects), rng.randint(1, 9))))
            else:  # the key's live rows after this one as the head lists them now (a hint that goes stale)
                head = self.inner.read(f"fxq:{m.ref.key}", "head") or {}
                ids = [str(e[1]) for e in head.get("live") or [] if e[1] != m.ref.effect_id]
                if r < 0.5:
                    rng.shuffle(ids)
                after = tuple(ids)
            adopt = m.adopt
            if self.adopts and rng.random() < 0.3:  # an old adopt header, perhaps of another row/attempt
                owners, attempt = rng.choice(self.adopts)
                adopt = (owners, attempt + rng.choice([0, 0, 1, -1]))
            self.pool[i] = Message(EffectRef(m.ref.key, m.ref.effect_id, m.ref.type, after), m.at, adopt)
            self.count("forged")
        super()._deliver(key)

    def _make_op(self, kind: str, key: str | None) -> Callable[[], None]:
        rng = self.rng
        if kind == "new" and rng.random() < 0.4 and len(self.effects) + 2 <= self.budget:
            k = key or rng.choice(self.keys)
            n = rng.randint(2, min(6, self.budget - len(self.effects)))
            items = []
            for _ in range(n):
                eid = f"e{len(self.effects)}"
                self.effects.append(eid)
                etype = rng.choice(list(EFFECT_TYPES)) if rng.random() < 0.3 else "email"
                at = None if rng.random() < 0.8 else self.now + rng.uniform(0.0, 30.0)
                items.append((eid, etype, k, at))
            return lambda: self._enqueue_many(items)
        return super()._make_op(kind, key)

    def _enqueue_many(self, items: list[tuple[str, str, str, float | None]]) -> None:
        eng = self.client.engine
        bodies, requests = [], {}
        for eid, etype, k, at in items:
            replay_safe, max_attempts = EFFECT_TYPES[etype]
            payload = {"n": int(eid[1:]) + 1}
            bodies.append(
                eng.effect_body(
                    etype,
                    payload,
                    key=k,
                    effect_id=eid,
                    available_at=at,
                    replay_safe=replay_safe,
                    max_attempts=max_attempts,
                )
            )
            requests[eid] = (etype, k, payload)
            self.cancel_guard.discard(eid)
            self.inflight[eid] = self.inflight.get(eid, 0) + 1
        self.count("enqueue_many")
        self.note(f"enqueue_many {[i[0] for i in items]} key {items[0][2]}")
        try:
            admitted = eng.admit_many(bodies)
        except (LaneFull, IdempotencyConflict):
            self.count("many_refused")
            return
        finally:
            for eid, *_ in items:
                self.inflight[eid] -= 1
        for a in admitted:
            check_admitted(self, a.effect_id, requests[a.effect_id], None, a)


def run_forged(seed: int, faults: Faults = Faults()) -> SimResult:
    with quiet():
        return ForgingSim(seed, faults).run()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    n, start = int(args[0]) if args else 200, int(args[1]) if len(args) > 1 else 0
    bad: list[Any] = []
    for seed in range(start, start + n):
        result = run_forged(seed)
        if result.violations:
            bad.append(result)
            print(result.violations[0], flush=True)
    print(f"{n} seeds from {start}: {len(bad)} with violations")
