"""The API inside a running activity: heartbeats, their details, cancellation (``from celery_durable import activity``).

>>> @durable_activity(heartbeat_timeout=60)
... def import_rows(path: str) -> int:
...     done = activity.last_heartbeat_details(0)   # where an earlier attempt got to
...     for n, row in enumerate(rows(path)):
...         if n < done:
...             continue
...         load(row)
...         activity.heartbeat(n + 1)               # raises ActivityCancelled once cancelled
...     return n + 1

Defined in :mod:`celery_durable.engine.activities.context`; see the Heartbeats guide. Before the
restructuring (issue 24) this path was the module of ``@durable_activity``: its names are still
found here, with a DeprecationWarning (``celery_durable.glue.durable_activity`` holds them).
"""

from typing import Any

from celery_durable._moved import moved_attr
from celery_durable.engine.activities.context import (
    CANCELLATION_MODES,
    ActivityCancelled,
    ActivityInfo,
    ActivityInterrupt,
    heartbeat,
    info,
    is_cancelled,
    last_heartbeat_details,
)
from celery_durable.engine.activities.publish import publish
from celery_durable.errors import HeartbeatTimeoutError

#: the names of the module this path was (``celery_durable.glue.durable_activity`` now)
OLD_NAMES = frozenset({"ActivityTask", "DURABLE_HEADER", "DurableActivityTask", "durable_activity", "task_retry"})

__all__ = [  # noqa: PLE0604 - the old names are found by __getattr__
    "CANCELLATION_MODES",
    "ActivityCancelled",
    "ActivityInfo",
    "ActivityInterrupt",
    "HeartbeatTimeoutError",
    "heartbeat",
    "info",
    "is_cancelled",
    "last_heartbeat_details",
    "publish",
    # a star import binds the old module's names as it did
    *sorted(OLD_NAMES),
]


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.glue.durable_activity", OLD_NAMES)
