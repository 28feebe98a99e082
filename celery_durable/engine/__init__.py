"""Replay engine (docs/architecture.md §6): no Celery import anywhere below this package."""

from celery_durable.engine.core import Engine
from celery_durable.engine.dispatcher import ActivityRequest, Dispatcher, InlineDispatcher
from celery_durable.engine.documents.model import Settings
from celery_durable.engine.registry import ActivityDef, Registry, WorkflowDef
from celery_durable.engine.replay.context import DurableFuture, WorkflowContext, current_context, in_workflow

__all__ = [
    "Engine",
    "Settings",
    "Registry",
    "WorkflowDef",
    "ActivityDef",
    "Dispatcher",
    "InlineDispatcher",
    "ActivityRequest",
    "WorkflowContext",
    "DurableFuture",
    "current_context",
    "in_workflow",
]
