"""The effect outbox's public path: what effect handlers import (``effect_context``, ``EffectCancelled`` …).

Defined in :mod:`celery_durable.glue.outbox` (the outbox on Celery) and
:mod:`celery_durable.engine.outbox` (its state machine); see the Effect outbox guide.
"""

from celery_durable.glue.outbox import (
    EFFECT_TASK_PREFIX,
    OUTBOX_SCAN_TASK,
    EffectCancelled,
    EffectContext,
    EffectInfo,
    EffectLeaseLost,
    EffectSpec,
    EffectTimeout,
    IdempotencyConflict,
    LaneFull,
    Outbox,
    Problems,
    StuckLane,
    effect_context,
)

__all__ = [
    "OUTBOX_SCAN_TASK",
    "EFFECT_TASK_PREFIX",
    "Outbox",
    "EffectInfo",
    "EffectSpec",
    "Problems",
    "StuckLane",
    "EffectContext",
    "EffectCancelled",
    "EffectTimeout",
    "EffectLeaseLost",
    "effect_context",
    "IdempotencyConflict",
    "LaneFull",
]
