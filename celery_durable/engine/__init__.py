"""Replay engine (docs/architecture.md §6): no Celery import anywhere below this package."""

from .context import DurableFuture, WorkflowContext, current_context, in_workflow
from .core import Engine
from .dispatcher import ActivityRequest, Dispatcher, InlineDispatcher
from .model import Settings
from .registry import ActivityDef, Registry, WorkflowDef

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
