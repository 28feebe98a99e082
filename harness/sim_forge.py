"""The engine simulation with a forging message source (issue 23, items 1 and 5).

On top of :class:`~.sim.Sim`'s faults, at random points of the fault phase a worker receives an
activity message that must not complete any step:

* a **stale** one: a message sent for a step, with the token of another reset generation, a
  random token or none, another activity's name, or other arguments (what a queued message of an
  older run, an older attempt or a purged execution of the same id holds);
* a **forged outcome**: the step header of a pending step (its genuine token, even) carrying an
  ``outcome``, a badly sealed one, or a genuine seal of another step's outcome.

Invariant 9: no step is begun or recorded from such a message (checked when the engine accepts
it, and at the end: no result holds a forged value). ``checks=False`` turns the engine's checks
off (the delivery proof and the seals), to show the harness catches what they prevent.

    python bench/sim.py --forge --seeds 300
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

from celery_durable.engine.activities import attempts as engine_activity
from celery_durable.engine.activities.delivery import Delivery, step_token
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.schema import result_id
from celery_durable.engine.drive import seals
from celery_durable.stores.base import Doc
from harness.sim import Sim
from harness.sim_faults import quiet
from harness.sim_store import Actor, Faults, Message, SimResult

__all__ = ["ForgingSim", "run_forged_seed", "FORGED_VALUE", "FORGE_INVARIANT"]

#: the value every forged outcome claims
FORGED_VALUE = "FORGED"
FORGE_INVARIANT = 9


class ForgingSim(Sim):
    def __init__(
        self,
        seed: int,
        faults: Faults = Faults(),
        known_bugs: Sequence[str] = (),
        *,
        checks: bool = True,
        rate: float = 0.25,
    ) -> None:
        super().__init__(seed, faults, known_bugs)
        self.checks = checks
        self.rate = rate
        self.sent: list[ActivityRequest] = []  # every genuine activity message seen
        self.forged: list[ActivityRequest] = []  # the stale ones sent (by identity)

    def run(self) -> SimResult:
        with self._checks():
            result = super().run()
        self._check_results()  # result.violations is self.violations
        return result

    @contextmanager
    def _checks(self) -> Iterator[None]:
        if self.checks:
            yield
            return

        def lax(store: Any, emit: Any, meta: dict[str, Any], step: Any, name: str) -> tuple[Doc | None, bool]:
            return meta.get("outcome"), False  # what the glue did before issue 23

        with (
            mock.patch.object(engine_activity, "refusal", lambda marker, delivery: None),
            mock.patch.object(seals, "read_step_header", lax),
        ):
            yield

    # --- the forging source ---------------------------------------------------------------

    def _deliver(self, pk: str | None = None) -> None:
        # genuine only: a forged message re-enters the pool as a duplicate or a glue retry does
        self.sent += [m.item for m in self.pool if m.kind == "activity" and self._genuine(m.item)]
        if self.faults_on and self.sent and self.rng.random() < self.rate:
            self._forge()
        super()._deliver(pk)

    def _genuine(self, req: ActivityRequest) -> bool:
        return req not in self.sent and not any(req is f for f in self.forged)

    def _handle_message(
        self, w: Actor, m: Message, claimed: str | None = None, handoff: tuple[str, int, str | None] | None = None
    ) -> None:
        """Every delivery (first, duplicate, retried): a stale one must not begin its step."""
        super()._handle_message(w, m, claimed, handoff)
        for f in self.inflight:
            if any(f.request is s for s in self.forged):
                self.violate(FORGE_INVARIANT, f"a stale delivery began {f.request.execution_id} step {f.request.seq}")
                self.inflight.remove(f)
                break

    def _forge(self) -> None:
        rng = self.rng
        req = rng.choice(self.sent)
        w = rng.choice([w for w in self.workers if w not in self.stack] or self.workers)
        if rng.random() < 0.6:
            stale = self._stale(req)
            self.forged.append(stale)
            self.count("forged_stale")
            self.run_as(w, "activity", lambda: self._handle(w, Message("activity", stale, self.now)))
        else:
            self.count("forged_outcome")
            self.run_as(w, "activity", lambda: self._forged_outcome(w, req))

    def _stale(self, req: ActivityRequest) -> ActivityRequest:
        rng = self.rng
        how = rng.choice(["generation", "random", "none", "name", "args"])
        if how == "generation" or (how == "none" and req.token is None):
            token = step_token(req.execution_id, req.run, req.seq, rng.randint(1, 3))
            return dataclasses.replace(req, token=token)
        if how == "random":
            return dataclasses.replace(req, token=f"{rng.getrandbits(96):024x}")
        if how == "none":
            return dataclasses.replace(req, token=None)
        if how == "name":
            names = sorted({r.name for r in self.sent if r.name != req.name}) or [req.name + ".other"]
            return dataclasses.replace(req, name=rng.choice(names))
        return dataclasses.replace(req, args=[*req.args, rng.randint(0, 9)])

    def _forged_outcome(self, w: Actor, req: ActivityRequest) -> None:
        """The glue's handling of a step header (glue/durable_activity.py ``_run_attempt``), for a forged one."""
        rng, eng = self.rng, w.engine
        step = (req.execution_id, req.run, req.seq)
        doc: Doc = {"pk": req.execution_id, "id": result_id(req.seq, req.run), "type": "result"}
        doc |= {"run": req.run, "seq": req.seq, "name": req.name, "ok": True, "value": FORGED_VALUE}
        meta: dict[str, Any] = {"e": req.execution_id, "s": req.seq, "r": req.run, "t": req.token}
        how = rng.choice(["raw", "bad mac", "other step", "other token"])
        if how == "raw":
            meta["outcome"] = doc
        elif how == "bad mac":
            meta["sealed"] = [json.dumps(doc), f"{rng.getrandbits(256):064x}"]
        elif how == "other step":  # a genuine seal, of another step's outcome
            meta["sealed"] = seals.seal_outcome(eng.store, (req.execution_id, req.run, req.seq + 1), req.token, doc)
        else:  # a genuine seal for this step under an older marker
            meta["sealed"] = seals.seal_outcome(eng.store, step, f"{rng.getrandbits(96):024x}", doc)
        if "sealed" in meta and meta["sealed"] is None:
            return  # the key could not be read (a store fault): nothing was forged
        outcome, dropped = seals.read_step_header(eng.store, eng.emit, meta, step, req.name)
        if dropped:
            return
        if outcome is None and "sealed" in meta:  # the lax header reading: what the seal carried
            outcome = json.loads(meta["sealed"][0])
        attempt, _why = eng.activities.begin(req.execution_id, req.seq, req.run, None, Delivery.of_request(req))
        if attempt is None or outcome is None:
            return
        self.violate(FORGE_INVARIANT, f"a forged outcome header completes {req.execution_id} step {req.seq}")
        eng.activities.complete(attempt, outcome | {"attempts": attempt.number})

    def _check_results(self) -> None:
        for pk in self.inner.scan_partitions("", 1_000_000):
            for doc in self.inner.query_partition(pk).docs:
                if doc.get("type") == "result" and doc.get("value") == FORGED_VALUE:
                    self.violate(FORGE_INVARIANT, f"{pk} {doc['id']} holds a forged value")


def run_forged_seed(
    seed: int, faults: Faults = Faults(), checks: bool = True, known_bugs: Sequence[str] = ()
) -> SimResult:
    with quiet():
        return ForgingSim(seed, faults, known_bugs, checks=checks).run()
