"""Sticky workflow instances: resume a suspended workflow instead of replaying it (architecture §6).

A full replay re-runs the workflow function from the top on every drive, so an n-step workflow
costs O(n²) CPU over its life. With the sticky cache the function runs in a ``greenlet``; where
it would unwind with :class:`.context.Suspend`, it switches back to the driver instead
(``WorkflowContext.park``) and stays alive in the process and thread that drove it, in a bounded
LRU keyed by execution id. The next drive of that execution in the same thread resumes it with
only the new documents, if everything it saw is unchanged:

* the same exec life and inputs: incarnation, generation, run, resets, cancel request, workflow
  (and the same registered function);
* every document it was fed still there, with the same etag or, when rewritten, the same
  content apart from the fields the replay never reads (attempt leases and scan due fields);
* the documents its last replay created committed (the driver confirms its commit: an entry
  whose commit failed or never happened is dropped) and unchanged likewise;
* nothing new but outcomes (``r:``) of activity, child, timer or external-signal steps: a new
  signal value, a signal wait's timeout or anything else means a full replay, which decides
  what depends on the order of the history (signal waits) from the top.

Anything else falls back to a full replay (and unwinds the old instance). So does every query
(read-only) and every replay that waits for local activities (the driver replays again after
running them). A resumed instance decides exactly what a full replay over the new history
would: everything before its suspension point was decided by recorded steps that did not
change, and at the suspension point it looks again at the (new) history.

An instance is unwound by throwing :class:`Suspend` into it (user ``finally`` blocks run as
under a full replay) when it is evicted, replaced or found stale; one that finished (completed,
failed, cancelled, continued) is simply gone. Greenlets are thread-bound: each thread has its
own LRU. Under gevent/eventlet monkey-patching the cache is off: "threads" are then green
threads (one per task, so nothing would ever hit) and a workflow greenlet that blocked on I/O
would hand control to the hub from inside a drive.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import TYPE_CHECKING, Any, Protocol

from greenlet import greenlet

from celery_durable.engine.documents.model import EXEC_ID, marker_id, run_of
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.replay.context import ContinueAsNew, Fatal, Suspend, WorkflowContext
from celery_durable.stores.base import RESERVED, Doc

if TYPE_CHECKING:
    from celery_durable.engine.registry import WorkflowDef

__all__ = ["StickyCache", "Outcome", "VOLATILE", "call", "green_pool"]

log = logging.getLogger("celery_durable.sticky")

#: what running the workflow function gave: ``(exception or None, return value)``
Outcome = tuple[BaseException | None, Any]

#: marker fields rewritten after the step was taken (attempt leases, scans) and never read by a replay
VOLATILE = frozenset({"lease", "attempts", "due_kind", "due_at", "started_at", "last_error", "joiners", "updated_at"})
#: steps whose new outcome a live instance may be resumed with (a signal wait's is decided by a replay)
_RESUMABLE_KINDS = frozenset({"activity", "child", "sleep", "signal_send"})
#: exec fields a context reads when it is made: a change means a full replay
_EXEC_KEY = (
    "incarnation",
    "generation",
    "run",
    "resets",
    "reruns",
    "cancel_requested",
    "timed_out",
    "deadline_at",
    "workflow",
)

_PARKED = object()


class Decided(Protocol):
    """What :meth:`StickyCache.settle` reads of a replay's decision (``replay.Replay``)."""

    @property
    def kind(self) -> str: ...

    @property
    def local(self) -> list[Any]: ...


def green_pool() -> bool:
    """Whether gevent or eventlet monkey-patched threading (a green pool): no sticky instances."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return True
    eventlet = sys.modules.get("eventlet.patcher")
    return bool(eventlet is not None and eventlet.is_monkey_patched("thread"))


def _exec_key(ex: ExecDoc) -> tuple[Any, ...]:
    return tuple(ex.get(k) for k in _EXEC_KEY)


def same_content(old: Doc, new: Doc) -> bool:
    """``new`` says what ``old`` said, for a replay (a marker may differ in :data:`VOLATILE` fields)."""
    ignore = VOLATILE if new.get("type") == "step" else frozenset()
    keys = (old.keys() | new.keys()) - ignore
    return all(k in RESERVED or old.get(k) == new.get(k) for k in keys)


@dataclass
class Held:
    """One live, suspended workflow instance."""

    glet: greenlet
    ctx: WorkflowContext
    fn: Callable[..., Any]
    exec_key: tuple[Any, ...]
    #: documents it was fed, by id (the history of its last drive)
    fed: dict[str, Doc] = field(default_factory=dict)
    #: documents its last drive created (to be committed with it)
    created: dict[str, Doc] = field(default_factory=dict)
    committed: bool = False
    #: what its last replay decided (the driver confirms the commit of exactly that)
    decided: object = None


class StickyCache:
    """Per-thread LRUs of live workflow instances (``size`` per thread; 0: off).

    ``check_history = False`` is a deliberately broken cache (``tests/sim/test_harness_can_fail.py``
    shows the simulation catches it): it resumes without checking that the documents the
    instance saw are unchanged and that nothing but outcomes of its steps is new.
    """

    #: False: the deliberately broken cache (see the class docstring)
    check_history = True

    def __init__(self, size: int) -> None:
        self.size = size
        self._local = threading.local()
        self.stats: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.size > 0 and not green_pool()

    def _lru(self) -> OrderedDict[str, Held]:
        lru: OrderedDict[str, Held] | None = getattr(self._local, "lru", None)
        if lru is None:
            lru = self._local.lru = OrderedDict()
        return lru

    def held(self) -> list[str]:
        """The execution ids of this thread's live instances, least recently used first."""
        return list(self._lru())

    # --- running ------------------------------------------------------------------------

    def run(
        self, ctx: WorkflowContext, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Outcome:
        """Run ``fn`` from the top in a new greenlet; a suspension parks it (see :meth:`settle`)."""
        self.drop(ctx.execution_id)
        glet = greenlet(functools.partial(call, ctx, fn, args, kwargs))
        glet.gr_context = contextvars.copy_context()
        ctx.park = _parker(glet, ctx)
        held = Held(glet, ctx, fn, ())
        self._lru()[ctx.execution_id] = held  # taken back by settle()
        return self._switch(held)

    def resume(
        self, ex: ExecDoc, history: Mapping[str, Doc], wf: WorkflowDef, now: float
    ) -> tuple[WorkflowContext, Outcome] | None:
        """Resume the live instance of ``ex`` with what is new in ``history``; None: replay fully."""
        pk = str(ex["pk"])
        held = self._lru().pop(pk, None)
        if held is None:
            self.stats["miss"] += 1
            return None
        why = self._stale(held, ex, history, wf)
        if why is not None:
            self.stats[f"fallback:{why}"] += 1
            _unwind(held)
            return None
        self.stats["hit"] += 1
        ctx = held.ctx
        ctx.history = dict(history)
        ctx.now = now
        ctx.new_docs = {}
        ctx.sends = []
        ctx.local_steps = []
        self._lru()[pk] = held
        return ctx, self._switch(held)

    def _stale(self, held: Held, ex: ExecDoc, history: Mapping[str, Doc], wf: WorkflowDef) -> str | None:
        """Why the held instance cannot be resumed over ``history`` (None: it can)."""
        if not held.committed:
            return "uncommitted"
        if held.glet.dead:
            return "dead"
        if held.fn is not wf.fn:
            return "code"
        if _exec_key(ex) != held.exec_key:
            return "exec"
        if not self.check_history:  # the known bug: trust whatever it saw
            return None
        seen, created = held.fed, held.created
        # one C-speed pass over the history (this runs on every drive): what is not the very
        # document the instance was fed, i.e. changed or new
        odd = list(compress(history, map(is_not, map(seen.get, history), history.values())))
        new_ids = []
        for doc_id in odd:
            old = seen.get(doc_id)
            if old is None:
                new_ids.append(doc_id)
                continue
            new = history[doc_id]
            if doc_id != EXEC_ID and (old.get("_etag") is None or new.get("_etag") != old.get("_etag")):
                if not same_content(old, new):
                    return "changed"
        if len(history) - len(new_ids) != len(seen):  # some document it was fed is gone
            return "deleted"
        for doc_id, mine in created.items():
            stored = history.get(doc_id)
            if stored is None:
                return "uncommitted"
            if stored is not mine and not same_content(mine, stored):
                return "changed"
        run = run_of(ex)
        for doc_id in new_ids:
            if doc_id in created:
                continue
            new = history[doc_id]
            if new.get("type") != "result" or run_of(new) != run or not isinstance(new.get("seq"), int):
                return "new-document"
            marker = seen.get(marker_id(new["seq"], run)) or created.get(marker_id(new["seq"], run))
            if marker is None or marker.get("kind") not in _RESUMABLE_KINDS:
                return "new-document"
        return None

    def _switch(self, held: Held) -> Outcome:
        held.glet.parent = greenlet.getcurrent()
        got = held.glet.switch()
        if got is _PARKED:
            return Suspend(), None
        assert isinstance(got, tuple)
        return got  # type: ignore[no-any-return]

    # --- after a replay -----------------------------------------------------------------

    def settle(self, ex: ExecDoc, decided: Decided) -> None:
        """Keep the instance that just replayed ``ex`` if it is parked (pending its commit)."""
        pk = str(ex["pk"])
        held = self._lru().get(pk)
        if held is None:
            return
        if decided.kind != "suspended" or decided.local or held.glet.dead:
            self.drop(pk)
            return
        held.decided = decided
        held.exec_key = _exec_key(ex)
        held.fed = held.ctx.history  # its own copy (the replay's); the exec is compared by _exec_key
        held.created = dict(held.ctx.new_docs)
        held.committed = False
        lru = self._lru()
        lru.move_to_end(pk)
        while len(lru) > self.size:
            _, old = lru.popitem(last=False)
            self.stats["evicted"] += 1
            _unwind(old)

    def committed(self, pk: str, decided: object) -> None:
        """The driver committed what ``decided`` (a replay of ``pk``) decided."""
        held = self._lru().get(pk)
        if held is not None and held.decided is decided:
            held.committed = True

    def drop(self, pk: str) -> None:
        """Forget (and unwind) the live instance of ``pk`` in this thread, if any."""
        held = self._lru().pop(pk, None)
        if held is not None:
            _unwind(held)

    def clear(self) -> None:
        lru = self._lru()
        while lru:
            _, held = lru.popitem(last=False)
            _unwind(held)


def call(ctx: WorkflowContext, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
    """Run the workflow function ``fn`` in ``ctx`` to its end or its suspension (a full replay's,
    or in a live instance's greenlet): how it ended, for ``replay`` to classify."""
    with ctx:
        try:
            return None, fn(*args, **kwargs)
        except (Suspend, ContinueAsNew, Fatal, Exception) as exc:  # its failure, or engine control flow
            return exc, None


def _parker(glet: greenlet, ctx: WorkflowContext) -> Callable[[], None]:
    def park() -> None:
        try:
            # back to the driver; resumed (returns) when a drive has news for this instance
            glet.parent.switch(_PARKED)
        except BaseException:
            # unwound (Suspend thrown at eviction, GreenletExit when collected): as at a full
            # replay's suspension, a durable call in a ``finally`` below raises Suspend
            ctx.park, ctx.unwinding = None, True
            raise

    return park


def _unwind(held: Held) -> None:
    """Unwind a parked instance as a full replay's suspension would (its ``finally`` blocks run)."""
    # a durable call while unwinding raises Suspend, as in a full replay (even past a swallowed one)
    held.ctx.park, held.ctx.unwinding = None, True
    glet = held.glet
    if glet.dead or not glet:
        return
    try:
        glet.parent = greenlet.getcurrent()
        glet.throw(Suspend())
    except ValueError:  # another thread's greenlet: it is killed (GreenletExit) when collected there
        return
    except (KeyboardInterrupt, SystemExit):  # an interrupt or a shutdown is not the workflow's: it goes on
        raise
    except BaseException:  # what user code raised while unwinding: a full replay would have started over
        log.debug("unwinding the instance of %s raised", held.ctx.execution_id, exc_info=True)
