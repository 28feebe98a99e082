"""What a durable call returns inside a workflow: a future whose ``result()`` waits durably."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from celery_durable.codecs import ValueCodec

__all__ = ["DurableFuture", "FutureOwner"]

T = TypeVar("T")


class FutureOwner(Protocol):
    """What a future asks of the workflow context that made it (``WorkflowContext``)."""

    def future_done(self, seq: int, name: str) -> bool: ...

    def outcome(self, seq: int, name: str, codec: ValueCodec, kind: str) -> Any: ...

    def settled(self, seq: int) -> bool: ...


class DurableFuture(Generic[T]):
    """The eventual result of a durable step; ``result()`` waits durably."""

    def __init__(self, ctx: FutureOwner, seq: int, name: str, codec: ValueCodec, kind: str = "activity") -> None:
        self._ctx = ctx
        self.seq = seq
        self.name = name
        self.kind = kind
        self._codec = codec
        self._child_id: str | None = None

    @property
    def workflow_id(self) -> str:
        """The workflow id of the child this future waits for (``start_child``); only children have one."""
        if self._child_id is None:
            raise AttributeError(f"a {self.kind} step has no workflow id: only a child workflow's future has one")
        return self._child_id

    def done(self) -> bool:
        """Whether the step has finished — a durable step itself, like ``durable.now()``.

        The first answer is recorded and every replay returns it, so code branching on it takes
        the same branch on replay even after the step finished in the meantime (answering from
        the current history would change the path and fail the execution as non-deterministic).
        Each call is a step: call it at the same points in the same order on every replay.
        """
        return self._ctx.future_done(self.seq, self.name)

    def result(self) -> T:
        value: T = self._ctx.outcome(self.seq, self.name, self._codec, self.kind)
        return value

    def __repr__(self) -> str:
        return f"<DurableFuture step={self.seq} {self.kind} {self.name} done={self._ctx.settled(self.seq)}>"
