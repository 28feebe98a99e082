"""The Cosmos store's operator listing (:meth:`Store.list_execs`), a mixin of :class:`CosmosStore`.

One cross-partition query per page, ``ORDER BY c.created_at DESC`` with ``max_item_count`` =
the page size; the SDK's continuation token is the cursor. A single ORDER BY key on purpose: a
composite one needs a composite index on the container. Only ``SELECT *``, ``WHERE`` and
``ORDER BY`` are used (the test server parses no ``OFFSET/LIMIT``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from celery_durable.stores.base import Doc, ExecFilter, ExecPage, check_page_size

if TYPE_CHECKING:
    from azure.cosmos import ContainerProxy

__all__ = ["CosmosListing", "exec_query"]

T = TypeVar("T")


def exec_query(flt: ExecFilter) -> tuple[str, list[dict[str, object]]]:
    """The SQL and parameters selecting the exec documents that pass ``flt``, newest first."""
    sql = "SELECT * FROM c WHERE c.id = 'exec'"
    params: list[dict[str, object]] = []
    for cond, name, value in (
        ("c.workflow = @wf", "@wf", flt.workflow),
        ("c.status = @st", "@st", flt.status),
        ("c.created_at >= @after", "@after", flt.created_after),
        ("c.created_at < @before", "@before", flt.created_before),
    ):
        if value is not None:
            sql += f" AND {cond}"
            params.append({"name": name, "value": value})
    return sql + " ORDER BY c.created_at DESC", params


class CosmosListing:
    if TYPE_CHECKING:  # provided by CosmosStore

        def _container(self) -> ContainerProxy: ...
        def _call(self, what: str, fn: Callable[[], T], *, idempotent: bool, doc: Doc | None = None) -> T: ...
        @staticmethod
        def _out(raw: Doc) -> Doc: ...
        def _list_by_search(self, flt: ExecFilter, limit: int, cursor: str | None) -> ExecPage: ...

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        check_page_size(limit)
        flt = flt or ExecFilter()
        if flt.search:  # the search index (search.py): cost grows with the value's executions
            return self._list_by_search(flt, limit, cursor)
        sql, params = exec_query(flt)
        c = self._container()

        def fetch() -> tuple[list[Doc], str | None]:
            query = c.query_items(sql, parameters=params, enable_cross_partition_query=True, max_item_count=limit)
            pages = query.by_page(cursor)
            page = [dict(i) for i in next(pages, [])]
            return page, cast(Any, pages).continuation_token

        raw, token = self._call("list_execs", fetch, idempotent=True)
        return ExecPage(docs=[self._out(r) for r in raw], cursor=token or None)
