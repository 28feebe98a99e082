"""Celery signal receivers, connected once per app in :func:`install` (``dispatch_uid``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import signals as celery_signals

from celery_durable.glue.hooks import EVENT_SIGNALS

if TYPE_CHECKING:
    from celery_durable.glue.extension import DurableLike

__all__ = ["install", "forward_event"]

log = logging.getLogger("celery_durable.signals")


def forward_event(event: str, **kwargs: Any) -> None:
    """Engine listener: re-send an engine event as the matching library signal."""
    signal = EVENT_SIGNALS.get(event)
    if signal is not None and signal.receivers:
        sender = kwargs.get("workflow") or kwargs.get("activity") or kwargs.get("effect_type") or "celery_durable"
        signal.send(sender=sender, **kwargs)


def install(durable: DurableLike) -> None:
    uid = f"celery_durable:{id(durable.app)}"

    def on_process_init(**_: Any) -> None:
        # A forked child must not share the parent's store connections (SQLite handles,
        # HTTP pools): drop them; the engine is rebuilt lazily in the child.
        durable.reset_after_fork()

    def on_shutdown(**_: Any) -> None:
        durable.shutdown()

    def on_task_postrun(task: Any = None, **_: Any) -> None:
        # Safety net: an attempt still tracked after its task returned (a BaseException that
        # bypassed the normal outcome path) gives its lease back, so recovery re-sends the step
        # at its next scan instead of waiting out the lease TTL.
        attempt = getattr(getattr(task, "request", None), "durable_attempt", None)
        engine = durable.engine_if_built
        if attempt is not None and engine is not None and attempt in engine.leases.running():
            log.warning("activity %s step %d ended without an outcome: lease released", attempt.name, attempt.seq)
            engine.leases.release(attempt)

    celery_signals.worker_process_init.connect(on_process_init, weak=False, dispatch_uid=uid + ":init")
    celery_signals.task_postrun.connect(on_task_postrun, weak=False, dispatch_uid=uid + ":postrun")
    celery_signals.worker_process_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid + ":pshutdown")
