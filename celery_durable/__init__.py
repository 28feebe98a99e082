"""celery_durable: durable workflows for teams that already run Celery.

>>> app = Celery("shop", broker="redis://localhost:6379/0")
>>> durable = Durable(app)
>>> @durable_activity
... def charge(order_id: str, cents: int) -> str: ...
>>> @durable.workflow
... def fulfil(order_id: str) -> str:
...     return charge(order_id, 100)
>>> fulfil.options(workflow_id="order-o-1").start("o-1").result(timeout=60)
"""

from celery_durable import _moved
from celery_durable.app import Durable, SharedWorkflow, Workflow, WorkflowOptions, shared_workflow
from celery_durable.engine.limits.spec import Limit
from celery_durable.errors import (
    ActivityError,
    ChildWorkflowError,
    ConfigurationError,
    DuplicateStart,
    DurableError,
    DurableTimeoutError,
    ExecutionEndedError,
    ExternalSignalError,
    HistoryUnavailableError,
    IdempotencyConflict,
    InvalidSearchAttribute,
    InvalidWorkflowId,
    LaneFull,
    NonDeterminismError,
    NonRetryableError,
    PayloadTooLarge,
    PayloadValidationError,
    QueryFailedError,
    StoreError,
    StoreUnavailable,
    UnknownQueryError,
    UnknownWorkflowError,
    UpdateFailedError,
    UpdateRefusedError,
    UpdateRejectedError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowTimedOutError,
)
from celery_durable.glue.durable_activity import durable_activity
from celery_durable.handle import ExecutionInfo, WorkflowHandle
from celery_durable.retry import RetryPolicy
from celery_durable.settings import DurableSettings
from celery_durable.workflow import DurableFuture

__version__ = "0.1.0"

_moved.install()  # the old module paths of the restructuring still import (with a warning)

__all__ = [
    "Durable",
    "Workflow",
    "WorkflowOptions",
    "SharedWorkflow",
    "shared_workflow",
    "durable_activity",
    "WorkflowHandle",
    "ExecutionInfo",
    "DurableFuture",
    "DurableSettings",
    "RetryPolicy",
    "Limit",
    "DurableError",
    "ConfigurationError",
    "PayloadValidationError",
    "PayloadTooLarge",
    "InvalidWorkflowId",
    "InvalidSearchAttribute",
    "UnknownWorkflowError",
    "NonDeterminismError",
    "WorkflowFailedError",
    "WorkflowCancelledError",
    "WorkflowTimedOutError",
    "ActivityError",
    "ChildWorkflowError",
    "ExternalSignalError",
    "NonRetryableError",
    "DuplicateStart",
    "DurableTimeoutError",
    "StoreError",
    "StoreUnavailable",
    "IdempotencyConflict",
    "LaneFull",
    "QueryFailedError",
    "UnknownQueryError",
    "HistoryUnavailableError",
    "UpdateRejectedError",
    "UpdateFailedError",
    "UpdateRefusedError",
    "ExecutionEndedError",
]
