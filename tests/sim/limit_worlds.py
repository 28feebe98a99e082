"""The world of the simulation's limit regressions (test_limit_give_back.py, test_limit_stale_slot.py):
two executions each calling one limited activity under ``max_running=1`` — e1's step holds the
slot, e2's waits — over a store that runs a hook inside the first lease write that follows (a
duplicate delivery interleaved with a ``begin``)."""

from __future__ import annotations

from collections.abc import Callable

from celery_durable import Limit
from celery_durable.engine.limits.slots import LIMIT_DOC_ID
from celery_durable.engine.limits.spec import limit_pk
from celery_durable.engine.replay.context import require_context
from celery_durable.stores.base import Doc
from celery_durable.stores.memory import MemoryStore
from tests.engine.inprocess import InProcess

__all__ = ["Interleaving", "one_slot_two_steps"]


class Interleaving(MemoryStore):
    """Runs ``hook`` (once) just before the first lease write on a marker while it is armed."""

    hook: Callable[[], None] | None = None

    def replace(self, doc: Doc, if_match: str | None) -> str:
        hook = self.hook
        if hook is not None and doc.get("type") == "step" and doc.get("lease"):
            self.hook = None
            hook()
        return super().replace(doc, if_match)


def one_slot_two_steps(limit_name: str) -> tuple[InProcess, Interleaving, str]:
    """The world, its store and the limit document's partition, e1 holding and e2 waiting."""
    store = Interleaving()
    w = InProcess(store=store)
    act = w.registry.add_activity("charge", lambda n: n, {"limit": Limit(limit_name, max_running=1)})

    def job(n: int) -> int:
        ctx = require_context("job")
        return int(ctx.call_activity(act.name, act.codec, (n,), {}, act.options).result())

    d = w.workflow(job)
    for eid in ("e1", "e2"):
        w.engine.start(d, (1,), {}, workflow_id=eid)
    while any(kind == "drive" for kind, _ in w.dispatcher.queue):
        kind, item = w.dispatcher.queue.popleft()
        if kind == "drive":
            w.engine.drive(item)
    w.dispatcher.queue.clear()  # e1's step holds the one slot, e2's waits
    lpk = limit_pk({"name": limit_name, "key": ""})
    doc = store.read(lpk, LIMIT_DOC_ID)
    assert doc is not None and list(doc["holders"]) == ["e1|0|1"] and len(doc["waiters"]) == 1
    return w, store, lpk
