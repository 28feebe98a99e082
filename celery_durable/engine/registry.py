"""Name → definition tables for workflows and activities (names are stored: keep them stable)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery_durable.codecs import CallCodec, codec_for
from celery_durable.engine.limits.spec import Limit, declare_limit
from celery_durable.errors import ConfigurationError

__all__ = ["WorkflowDef", "ActivityDef", "Registry"]


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    fn: Callable[..., Any]
    codec: CallCodec
    #: declared signal types: values are validated against them when sent
    signals: dict[str, Any] = field(default_factory=dict)
    #: its executions wait for a slot of this limit before they start (engine/limits/workflows.py)
    limit: Limit | None = None

    @property
    def signal_names(self) -> list[str] | None:
        """The declared names as recorded in an exec document; ``None``: any name is accepted."""
        return sorted(self.signals) or None


@dataclass(frozen=True)
class ActivityDef:
    name: str
    fn: Callable[..., Any]
    codec: CallCodec
    options: dict[str, Any] = field(default_factory=dict)


#: Activities declared with ``@durable_activity`` are Celery shared tasks, usable by every app,
#: so their definitions are process-wide too.
GLOBAL_ACTIVITIES: dict[str, ActivityDef] = {}
#: Workflows declared with ``@shared_workflow`` (reusable apps, as Celery's ``shared_task``):
#: known to every app's registry.
GLOBAL_WORKFLOWS: dict[str, WorkflowDef] = {}


def add_shared_workflow(
    name: str, fn: Callable[..., Any], signals: dict[str, Any] | None = None, limit: Limit | None = None
) -> WorkflowDef:
    """Declare a workflow every :class:`Registry` knows (``@shared_workflow``)."""
    existing = GLOBAL_WORKFLOWS.get(name)
    if existing is not None and existing.fn is not fn:
        raise ConfigurationError(f"two shared workflows are named {name!r}")
    wf = GLOBAL_WORKFLOWS[name] = WorkflowDef(name, fn, codec_for(fn), dict(signals or {}), _declared(limit))
    return wf


def _declared(limit: object) -> Limit | None:
    if limit is None:
        return None
    if not isinstance(limit, Limit):
        raise ConfigurationError(f"a workflow's limit= takes a celery_durable.Limit, not {limit!r}")
    return declare_limit(limit)


class Registry:
    def __init__(self) -> None:
        self.workflows: dict[str, WorkflowDef] = {}
        self.activities: dict[str, ActivityDef] = {}

    def add_workflow(
        self, name: str, fn: Callable[..., Any], signals: dict[str, Any] | None = None, limit: Limit | None = None
    ) -> WorkflowDef:
        existing = self.workflows.get(name) or GLOBAL_WORKFLOWS.get(name)
        if existing is not None and existing.fn is not fn:
            raise ConfigurationError(f"two workflows are named {name!r}")
        wf = WorkflowDef(name, fn, codec_for(fn), dict(signals or {}), _declared(limit))
        self.workflows[name] = wf
        return wf

    def add_activity(self, name: str, fn: Callable[..., Any], options: dict[str, Any] | None = None) -> ActivityDef:
        act = ActivityDef(name, fn, codec_for(fn), dict(options or {}))
        self.activities[name] = act
        return act

    def workflow(self, name: str) -> WorkflowDef | None:
        return self.workflows.get(name) or GLOBAL_WORKFLOWS.get(name)

    def workflow_names(self) -> list[str]:
        """Every workflow this registry runs: its own and the shared ones."""
        return sorted({*self.workflows, *GLOBAL_WORKFLOWS})

    def activity(self, name: str) -> ActivityDef | None:
        return self.activities.get(name) or GLOBAL_ACTIVITIES.get(name)
