"""The day-two operations of :class:`~celery_durable.Durable` (issue 27): pausing an execution,
a batch over a query, a Celery canvas run durably — kept apart from app.py, which wires the app."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_durable.engine.admin.batch import BATCH_WORKFLOW, batch_spec
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.glue.canvas import CANVAS_WORKFLOW, check_canvas
from celery_durable.handle import WorkflowHandle
from celery_durable.schedules import Schedules

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine
    from celery_durable.engine.registry import Registry

__all__ = ["DayTwo"]


class DayTwo:
    """Mixed into :class:`~celery_durable.Durable` (which gives ``engine`` and ``registry``)."""

    registry: Registry
    _schedules: dict[str, dict[str, Any]]

    @property
    def engine(self) -> Engine:
        raise NotImplementedError  # Durable's

    @property
    def schedules(self) -> Schedules:
        """Managed schedules: ``create/update/delete/pause/resume/trigger/backfill/get/list``
        (celery_durable/schedules.py); the ones of :meth:`schedule` are listed, read-only."""
        return Schedules(lambda: self.engine, self.registry, lambda: self._schedules)

    def pause(self, workflow_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Pause an execution that has not ended: nothing of it is replayed (no new step, no new
        activity) until :meth:`unpause`; what arrives meanwhile is recorded. False if it was paused
        already. Recorded (``by``: who, default ``user@host``)."""
        return pause(self.engine, workflow_id, actor() if by is None else by, reason)

    def unpause(self, workflow_id: str, *, by: str | None = None, reason: str | None = None) -> bool:
        """Unpause an execution and drive it now; False if it was not paused. Recorded."""
        return unpause(self.engine, workflow_id, actor() if by is None else by, reason)

    def batch(
        self, action: str, *, since: datetime | timedelta | float | None = None, **spec: Any
    ) -> WorkflowHandle[Any]:
        """Start a batch: ``action`` (cancel, terminate, retry, resume, reset, pause, unpause, signal)
        on every execution of ``workflow=``, ``status=``, ``search=`` started ``since`` (a datetime,
        epoch seconds, or a timedelta: that long ago), as a durable workflow reporting its progress
        as its custom status; ``rate=`` executions per second, ``page_size=``, ``reason=``, ``by=``,
        ``step=`` (reset), ``signal=``/``value=`` (signal). Checked here (ConfigurationError)."""
        if isinstance(since, timedelta):
            since = self.engine.clock.now() - since.total_seconds()
        after = since.timestamp() if isinstance(since, datetime) else since
        query, options = batch_spec(action, since=after, by=spec.pop("by", None) or actor(), **spec)
        definition = self.registry.workflow(BATCH_WORKFLOW)
        assert definition is not None  # glue/batch.py declares it for every Durable
        eid, _ = self.engine.start(definition, (action, query, options), {})
        return WorkflowHandle(self.engine, eid, definition)

    def run(self, canvas: Any, *, workflow_id: str | None = None) -> WorkflowHandle[Any]:
        """Run a Celery canvas durably (``chain``, ``group``, ``chord``, ``.s``/``.si``, ``link``,
        ``link_error``): each task an activity step of one execution (glue/canvas.py). Every task
        must be a ``@durable_activity`` (checked here: ConfigurationError); the handle's result is
        the canvas's."""
        definition = self.registry.workflow(CANVAS_WORKFLOW)
        assert definition is not None  # glue/canvas.py declares it for every Durable
        eid, _ = self.engine.start(definition, (check_canvas(canvas, self.registry),), {}, workflow_id=workflow_id)
        return WorkflowHandle(self.engine, eid, definition)
