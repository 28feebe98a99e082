"""Which worker pools can stop a running effect handler, and the worker's refusal when one cannot.

A cancel or a ``timeout`` stops an interruptible handler by raising an exception into the OS
thread it runs on (``PyThreadState_SetAsyncExc``, from the heartbeat thread). That needs each
task on its own OS thread and a heartbeat that runs beside it: true of the prefork, threads and
solo pools. Under gevent and eventlet (or anywhere ``threading`` is monkey-patched) every task is
a greenlet on one OS thread: ``threading.get_ident()`` names a greenlet, so the interrupt lands
nowhere and the handler runs to its end (measured: a cancelled or timed-out handler ran its full
8 s); and a CPU-bound handler never yields, so the heartbeat greenlet does not even run.

Cooperative checks (``effect_context().sleep()``, ``.check()``, ``.cancelled()``) do work there:
the heartbeat greenlet runs whenever the handler yields, and ``sleep()`` yields. So a worker on
such a pool refuses to start while it consumes a queue that an effect declared ``interruptible``
(the default) or with a ``timeout`` is routed to (:func:`check_worker`, from the bootstep).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any

from celery_durable.engine.outbox.runtime import EffectDef, effects_of
from celery_durable.errors import ConfigurationError
from celery_durable.glue.extension import DurableLike

__all__ = [
    "GREEN_POOLS",
    "pool_name",
    "green_threads",
    "needs_interrupt",
    "effect_refusal",
    "check_worker",
    "note_worker_limits",
    "time_limit",
]

#: pools that run tasks as greenlets on one OS thread
GREEN_POOLS = frozenset({"gevent", "eventlet"})

_POOL_MODULES = {
    "celery.concurrency.prefork": "prefork",
    "celery.concurrency.thread": "threads",
    "celery.concurrency.solo": "solo",
    "celery.concurrency.gevent": "gevent",
    "celery.concurrency.eventlet": "eventlet",
}


def pool_name(pool_cls: Any) -> str:
    """``prefork``, ``threads``, ``solo``, ``gevent``, ``eventlet``, or the class path of a custom pool."""
    if isinstance(pool_cls, str):
        from celery import concurrency

        alias = pool_cls.split(":", 1)[0]
        if alias in concurrency.ALIASES:
            return "prefork" if alias == "processes" else alias
        module = alias
    else:
        module = getattr(pool_cls, "__module__", "") or ""
    known = _POOL_MODULES.get(module)
    if known is not None:
        return known
    return f"{module}:{getattr(pool_cls, '__qualname__', pool_cls)}"


def green_threads() -> str | None:
    """The green-thread library ``threading`` is patched with in this process, or None.

    Looked up in ``sys.modules`` only (importing gevent or eventlet here would be wrong); the
    last test is the one the interrupt depends on: does ``threading.get_ident()`` name an OS thread?
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    module = getattr(threading.get_ident, "__module__", None) or "_thread"
    if module != "_thread":
        return module.split(".", 1)[0]
    return None


def needs_interrupt(definition: EffectDef) -> str | None:
    """Why stopping this effect needs the async interrupt (``None``: cooperative only)."""
    reasons = []
    if definition.interruptible:
        reasons.append("interruptible=True")
    if definition.timeout is not None:
        reasons.append(f"timeout={definition.timeout:g}s")
    return ", ".join(reasons) or None


def _fix(pool: str) -> str:
    return (
        "Declare such effects with interruptible=False and no timeout (a cancel then stops them at "
        "effect_context().sleep() / .check() / .cancelled()), or run them on a prefork, threads or "
        f"solo worker: route them to a queue (@durable.effect(..., queue=...)) that this {pool} "
        "worker does not consume."
    )


def effect_refusal(definition: EffectDef, pool: str | None = None) -> str | None:
    """The error text if ``definition`` cannot be stopped in this process (pool name or patching)."""
    green = pool if pool in GREEN_POOLS else green_threads()
    reason = needs_interrupt(definition)
    if green is None or reason is None:
        return None
    return (
        f"effect {definition.type!r} ({reason}) cannot be interrupted under the {green} pool: "
        f"{green} runs every task on one OS thread, so a cancel or timeout could not stop its "
        f"handler. {_fix(green)}"
    )


def _consumed(app: Any, definition: EffectDef, queues: set[str]) -> bool:
    """Does this worker consume the queue the effect's messages are sent to (as CeleryEffectSender routes them)?"""
    options = {"queue": definition.queue} if definition.queue else {}
    try:
        queue = app.amqp.router.route(options, definition.task_name).get("queue")
    except Exception:  # an unroutable name: assume the worst rather than start a worker that cannot stop it
        return True
    name = getattr(queue, "name", queue)
    return name is None or name in queues


def _refused(app: Any, definitions: Iterable[EffectDef]) -> list[str]:
    queues = {str(name) for name in app.amqp.queues.consume_from}
    return [
        f"{d.type!r} ({needs_interrupt(d)})" for d in definitions if needs_interrupt(d) and _consumed(app, d, queues)
    ]


def check_worker(worker: Any, durable: DurableLike) -> None:
    """Refuse to start a worker that would run effects it cannot stop (see the module docstring).

    Called from :class:`~celery_durable.glue.bootsteps.DurableStep` once the worker knows its pool
    class and has selected its queues (``-Q``/``-X``), before it connects to the broker.
    """
    pool = pool_name(getattr(worker, "pool_cls", None) or worker.app.conf.worker_pool)
    green = pool if pool in GREEN_POOLS else green_threads()
    if green is None:
        return
    definitions = sorted(effects_of(durable.registry).defs.values(), key=lambda d: d.type)
    refused = _refused(worker.app, definitions)
    if not refused:
        return
    where = f"the {green} pool" if green == pool else f"a {pool} worker with threading monkey-patched by {green}"
    raise ConfigurationError(
        f"celery_durable: this worker cannot stop the handlers of effect(s) {', '.join(refused)} on "
        f"{where}: {green} runs every task as a greenlet on one OS thread, so a cancel or timeout "
        f"cannot interrupt a running handler. {_fix(green)}"
    )


#: the worker's own time limits (``--time-limit``/``--soft-time-limit``: not in app.conf), noted
#: by the worker bootstep before the pool forks
_WORKER_LIMITS: list[Any] = [None, None]


def note_worker_limits(hard: Any, soft: Any) -> None:
    _WORKER_LIMITS[:] = [hard, soft]


def time_limit(task: Any, app: Any, request: Any = None) -> float | None:
    """The smallest time limit (soft or hard: the message's, the task's, the worker's
    configuration or command line) that applies to a delivery of ``task``, in seconds; None
    when there is none."""
    soft, hard = getattr(request, "timelimit", None) or (None, None)
    conf = app.conf
    found = [soft, hard, getattr(task, "soft_time_limit", None), getattr(task, "time_limit", None), *_WORKER_LIMITS]
    found += [conf.get("task_soft_time_limit"), conf.get("task_time_limit")]
    limits = [float(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool) and v > 0]
    return min(limits) if limits else None
