"""The operator's side (docs/architecture.md §10): ``operator`` (``Admin``: list, describe, retry,
resume, reset, purge), each action recorded with what it forgot (``oplog``, ``superseded``),
crash-safe rewrites rolled forward by whoever comes next (``pending_ops``, ``purge``), the ids a
re-run takes (``reruns``), ``reset`` and the cancel cascade it withdraws (``cancel_withdrawal``,
``child_ops``), the read model (``timeline``, ``undecodable``) and how operator tools word things
(``wording``).
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset(
    {
        "Admin",
        "ExecutionSummary",
        "ExecutionPage",
        "ExecutionDetail",
        "StepRecord",
        "SignalRecord",
        "PurgeReport",
        "OperationRefused",
        "summary_of",
        "describe_docs",
    }
)
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.engine.admin.operator", OLD_NAMES)
