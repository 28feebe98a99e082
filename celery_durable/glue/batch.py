"""The batch workflow (``celery_durable.batch``): an operator action over every execution a query
selects, page by page, as a durable workflow of its own (engine/admin/batch.py says how a page is
acted on). Each page is one activity (``celery_durable.batch.page``, run by any worker of the
app): recorded once done, so a killed worker costs at most one page acted on again (every action
is safe to repeat). Its custom status is its progress (``durable show ID``, ``durable batch
--wait``); with ``rate`` it sleeps between pages (executions per second); every
``PAGES_PER_RUN`` pages it continues as new, so a batch over millions keeps a short history.
"""

from __future__ import annotations

from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.activities.context import current
from celery_durable.engine.admin.batch import BATCH_WORKFLOW, apply_page
from celery_durable.engine.registry import add_shared_workflow
from celery_durable.errors import DurableError
from celery_durable.glue.durable_activity import durable_activity

__all__ = ["BATCH_WORKFLOW", "PAGE_ACTIVITY", "PAGES_PER_RUN", "batch_page", "run_batch"]

PAGE_ACTIVITY = "celery_durable.batch.page"
#: pages per run: then the batch continues as new with its totals and cursor
PAGES_PER_RUN = 50


@durable_activity(name=PAGE_ACTIVITY, autoretry_for=(DurableError,), retry_backoff=True, max_retries=5)
def batch_page(action: str, query: dict[str, Any], cursor: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """Act on one page of the batch's query (engine/admin/batch.py); its counts and next cursor."""
    ctx = current()
    if ctx is None or ctx.engine is None:
        raise RuntimeError(f"{PAGE_ACTIVITY} runs as a durable activity of a batch")
    return apply_page(ctx.engine, action, query, cursor, options, ctx.info.execution_id)


def run_batch(
    action: str, query: dict[str, Any], options: dict[str, Any], totals: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The batch: pages until the query's cursor runs out; its totals (``matched``, ``done``,
    ``refused``, the latest ``errors``, ``pages``)."""
    t: dict[str, Any] = {"matched": 0, "done": 0, "refused": 0, "errors": [], "pages": 0} | dict(totals or {})
    cursor = t.pop("cursor", None)
    for _ in range(PAGES_PER_RUN):
        page = batch_page(action, query, cursor, options)
        for key in ("matched", "done", "refused"):
            t[key] += int(page[key])
        t["errors"] = [*t["errors"], *page["errors"]][-20:]
        t["pages"] += 1
        cursor = page["cursor"]
        wf.set_status(t | {"finished": cursor is None})
        if cursor is None:
            return t
        rate = options.get("rate")
        if rate and page["matched"]:
            wf.sleep(float(page["matched"]) / float(rate))
    wf.continue_as_new(action, query, options, t | {"cursor": cursor})
    raise AssertionError("unreachable: continue_as_new does not return")  # pragma: no cover


BATCH = add_shared_workflow(BATCH_WORKFLOW, run_batch)
