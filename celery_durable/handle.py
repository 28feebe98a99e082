"""Handles: what ``start()`` returns and ``Durable.handle(id)`` builds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .engine.model import CANCELLED, COMPLETED, FAILED
from .errors import WorkflowCancelledError, WorkflowFailedError

if TYPE_CHECKING:
    from .engine.core import Engine
    from .engine.registry import WorkflowDef

__all__ = ["WorkflowHandle", "ExecutionInfo"]

R = TypeVar("R")


@dataclass(frozen=True)
class ExecutionInfo:
    """A snapshot of an execution (``handle.poll()``)."""

    id: str
    workflow: str
    status: str
    result: Any
    error: dict[str, Any] | None
    last_error: str | None
    steps: int
    cancel_requested: bool
    created_at: float
    updated_at: float

    @property
    def done(self) -> bool:
        return self.status in (COMPLETED, FAILED, CANCELLED)


class WorkflowHandle(Generic[R]):
    """Refers to one execution by id; cheap to create, safe to share."""

    def __init__(self, engine: Engine, workflow_id: str, definition: WorkflowDef | None = None) -> None:
        self._engine = engine
        self.id = workflow_id
        self._definition = definition

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id}>"

    def poll(self) -> ExecutionInfo:
        """Read the execution's current state (one point read)."""
        doc = self._engine.read_exec(self.id)
        return ExecutionInfo(
            id=self.id,
            workflow=str(doc.get("workflow")),
            status=str(doc.get("status")),
            result=doc.get("result"),
            error=doc.get("error"),
            last_error=doc.get("last_error"),
            steps=int(doc.get("steps") or 0),
            cancel_requested=bool(doc.get("cancel_requested")),
            created_at=float(doc.get("created_at") or 0),
            updated_at=float(doc.get("updated_at") or 0),
        )

    def status(self) -> str:
        """``running``, ``completed``, ``failed`` or ``cancelled``."""
        return self.poll().status

    def result(self, timeout: float | None = None) -> R:
        """Wait for the end; return the typed result or raise why it did not complete."""
        doc = self._engine.wait(self.id, timeout=timeout)
        status = doc.get("status")
        if status == COMPLETED:
            definition = self._definition or self._engine.registry.workflow(str(doc.get("workflow")))
            if definition is None:
                raw: R = doc.get("result")  # type: ignore[assignment]  # untyped: JSON as stored
                return raw
            decoded: R = definition.codec.decode_result(doc.get("result"))
            return decoded
        err = doc.get("error") or {}
        if status == CANCELLED:
            raise WorkflowCancelledError(f"workflow {self.id!r} was cancelled")
        raise WorkflowFailedError(self.id, str(err.get("type", "Error")), str(err.get("message", "")))

    def signal(self, name: str, value: Any) -> bool:
        """Send signal ``name``; validated against the declared type here and kept until a wait
        consumes it (each wait takes the next value). False when the execution has ended."""
        return self._engine.signal(self.id, name, value)

    def cancel(self) -> bool:
        """Request cancellation; False if the execution had already ended."""
        return self._engine.cancel(self.id)
