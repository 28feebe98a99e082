"""How many executions are in each status (the UI list's header), counted over the paged
listing every store serves (``Store.list_execs``), up to a cap: a count is exact below it and
"at least the cap" above, so a page load never reads more than ``cap`` exec documents a status."""

from __future__ import annotations

from dataclasses import dataclass

from celery_durable.engine.documents.schema import Status
from celery_durable.stores.base import MAX_PAGE_SIZE, ExecFilter, Store

__all__ = ["StatusCount", "status_counts", "DEFAULT_CAP"]

#: counted exactly up to this many executions per status (a list page reads at most this many
#: exec documents per status for its header: on Cosmos each is a request unit or more)
DEFAULT_CAP = 200


@dataclass(frozen=True)
class StatusCount:
    status: str
    count: int
    #: more than ``count`` exist (the cap was reached)
    more: bool = False


def status_counts(store: Store, workflow: str | None = None, cap: int = DEFAULT_CAP) -> list[StatusCount]:
    """Per status (running, completed, failed, cancelled), how many executions of ``workflow``
    (any when None) the store lists; each at most ``cap`` (then ``more``)."""
    out: list[StatusCount] = []
    for status in Status:
        n, cursor, more = 0, None, False
        while True:
            page = store.list_execs(ExecFilter(workflow=workflow, status=status.value), min(MAX_PAGE_SIZE, cap), cursor)
            n += len(page.docs)
            cursor = page.cursor
            if cursor is None:
                break
            if n >= cap:
                more = True
                break
        out.append(StatusCount(status.value, min(n, cap), more))
    return out
