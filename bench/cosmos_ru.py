"""Request units per activity on Azure Cosmos DB, estimated from the store's request mix.

Runs workflows of N sequential activities in-process (``WorkflowEnvironment``: no broker) on an
in-memory store wrapped in :class:`~celery_durable.testing.counting.CountingStore`, and prices each
store call with Cosmos' documented costs for the recommended indexing policy
(``docs/azure/indexing-policy.json``: only the queried paths are indexed):

* point read: 1 RU per KB read (at least 1); a miss 1 RU
* write (create / replace / upsert): ~5.5 RU per KB written (at least 5.5); delete ~5.5 RU
* batch: its operations' writes (Cosmos charges a transactional batch as its operations)
* query in one partition (``read_many``, ``query_partition``): ~2.5 RU + 1 RU per KB returned
* a due document's write also upserts a ~0.3 KB index entry (~5.5 RU, a request of its own) unless
  it keeps its predecessor's (heartbeats) or takes the one another op of its batch lets go of (a
  step commit: ``DueIndex.handoffs``); the store's own rules decide, here as in the store
* each entry written is later cleaned up by a due scan: a point read of its target, a query of
  the target's partition for the document it was handed to, and a delete (~9 RU, 3 requests),
  counted apart from the requests on a step's path
* ``scan_due`` (not per activity, per scan): ``due_shards`` single-partition queries per minute
  bucket scanned (~2.5 RU each) plus one point read per due entry

These are estimates (real charges vary with document shape, consistency and region count); the
point is the order of magnitude and how it moves with the payload size. Printed beside the
request counts they come from.

    python bench/cosmos_ru.py                       # 20 activities, 1 KB payloads
    python bench/cosmos_ru.py --payload 16384 --activities 50
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from _common import print_table, verdict
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead
from celery_durable.stores.cosmos.index import DueIndex
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.counting import CountingStore
from celery_durable.testing.env import WorkflowEnvironment

READ_RU_PER_KB = 1.0
WRITE_RU_PER_KB = 5.5
QUERY_RU = 2.5
ENTRY_KB = 0.3


def _kb(doc: Doc | None) -> float:
    if doc is None:
        return 0.0
    body = {k: v for k, v in doc.items() if k != "_etag"}
    return len(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) / 1024


ENTRY_RU = WRITE_RU_PER_KB * max(1.0, ENTRY_KB)
#: a later scan's cleanup of one entry: point read of its target, holder query, delete
CLEANUP_RU, CLEANUP_REQUESTS = READ_RU_PER_KB + QUERY_RU + WRITE_RU_PER_KB, 3


def _write_ru(doc: Doc | None) -> float:
    return max(WRITE_RU_PER_KB, WRITE_RU_PER_KB * _kb(doc))


class PricedStore(CountingStore):
    """Counts round trips (as CountingStore) and adds up their estimated request units; the due
    index entries the Cosmos store would write are decided by its own rules (:class:`DueIndex`)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.ru: defaultdict[str, float] = defaultdict(float)
        self.index = DueIndex()
        #: the entry each document's current version relies on
        self.refs: dict[tuple[str, str], list[Any] | None] = {}
        self.later: defaultdict[str, float] = defaultdict(float)

    def _due(self, op: str, doc: Doc, handed: list[Any] | None = None) -> None:
        """The entry ``doc``'s write relies on: its predecessor's (a trusted replace), the one
        ``handed`` to it, or a new one (a request and ~5.5 RU now, a cleanup later)."""
        key = (str(doc["pk"]), str(doc["id"]))
        self.refs[key], entry = self.index.cover(
            doc, self.refs.get(key) if op == "replace" else None, handed, time.time()
        )
        if entry is not None:
            self.counts["index entry"] += 1
            self.ru["index entry"] += ENTRY_RU
            self.later["requests"] += CLEANUP_REQUESTS
            self.later["ru"] += CLEANUP_RU

    def reset(self) -> Counter[str]:
        self.later.clear()
        return super().reset()

    def read(self, pk: str, doc_id: str) -> Doc | None:
        doc = super().read(pk, doc_id)
        self.ru["read"] += max(1.0, READ_RU_PER_KB * _kb(doc))
        return doc

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        docs = super().read_many(pk, ids)
        if ids:
            self.ru["read_many"] += QUERY_RU + READ_RU_PER_KB * sum(_kb(d) for d in docs)
        return docs

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        got = super().query_partition(pk, since)
        self.ru["query_partition"] += QUERY_RU + READ_RU_PER_KB * sum(_kb(d) for d in got.docs)
        return got

    def create(self, doc: Doc) -> str | None:
        self.ru["create"] += _write_ru(doc)
        etag = super().create(doc)
        if etag is not None:
            self._due("create", doc)
        return etag

    def replace(self, doc: Doc, if_match: str | None) -> str:
        self.ru["replace"] += _write_ru(doc)
        etag = super().replace(doc, if_match)
        self._due("replace", doc)
        return etag

    def upsert(self, doc: Doc) -> str:
        self.ru["upsert"] += _write_ru(doc)
        etag = super().upsert(doc)
        self._due("upsert", doc)
        return etag

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        self.ru["delete"] += WRITE_RU_PER_KB
        return super().delete(pk, doc_id, if_match)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self.ru["batch"] += sum(_write_ru(op.doc) if op.doc is not None else WRITE_RU_PER_KB for op in ops)
        prevs = [self.refs.get((pk, op.doc_id)) if op.kind == "replace" else None for op in ops]
        planned = [(op.kind, op.doc, prev) for op, prev in zip(ops, prevs, strict=True)]
        handed = self.index.handoffs(planned, time.time())
        etags = super().batch(pk, ops)
        for i, op in enumerate(ops):
            if op.doc is not None:
                self._due(op.kind, op.doc, handed.get(i))
        return etags

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        found = super().scan_due(kind, now, limit)
        self.ru["scan_due"] += 4 * QUERY_RU + READ_RU_PER_KB * len(found)  # 4 shards, one bucket
        return found


@durable_activity(name="bench.cosmos_ru.step")
def step(data: str, i: int) -> str:
    return data[: len(data) - len(str(i))] + str(i)


def run(activities: int, payload: int, workflows: int, delivered: bool = False) -> tuple[PricedStore, int]:
    durable = Durable(Celery("cosmos-ru", set_as_current=False), store="memory://")

    @durable.workflow(name="bench.cosmos_ru.chain")
    def chain(data: str, n: int) -> int:
        for i in range(n):
            data = step(data, i)
        return len(data)

    store = PricedStore(MemoryStore())
    env = WorkflowEnvironment(durable, store=store)
    # as a worker with eager activities (the default) runs a sequential workflow: the commit that
    # schedules a step takes its lease, and the step runs next in the same process
    env.dispatcher.eager = not delivered
    # the first run warms registries; count the rest
    env.result(env.start(chain, "x" * payload, 1))
    store.reset()
    store.ru.clear()
    for _ in range(workflows):
        assert env.result(env.start(chain, "x" * payload, activities)) == payload
    return store, activities * workflows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--activities", type=int, default=20, help="sequential activities per workflow")
    parser.add_argument("--payload", type=int, default=1024, help="bytes of each activity's input and result")
    parser.add_argument("--workflows", type=int, default=5)
    parser.add_argument("--delivered", action="store_true", help="every activity a message (eager activities off)")
    args = parser.parse_args()
    store, n = run(args.activities, args.payload, args.workflows, args.delivered)
    ops = sorted(set(store.counts) | set(store.ru))
    rows = [[op, f"{store.counts[op] / n:.2f}", f"{store.ru[op] / n:.1f}"] for op in ops]
    total_requests, total_ru = sum(store.counts.values()) / n, sum(store.ru.values()) / n
    rows.append(["total on the steps' path", f"{total_requests:.2f}", f"{total_ru:.1f}"])
    later_requests, later_ru = store.later["requests"] / n, store.later["ru"] / n
    rows.append(["later: a due scan cleans up the entries", f"{later_requests:.2f}", f"{later_ru:.1f}"])
    total_ru += later_ru
    print(f"{args.workflows} workflows x {args.activities} activities, {args.payload} B payloads")
    print_table(["store call", "requests / activity", "est. RU / activity"], rows)
    print(
        f"~{total_ru:.0f} RU per activity: 100 activities/s need ~{total_ru * 100:,.0f} RU/s "
        f"(manual throughput, or autoscale_max >= {total_ru * 100 / 0.9:,.0f})"
    )
    mode = "every activity delivered" if args.delivered else "eager activities (the default)"
    print(verdict(f"Cosmos requests per activity on the steps' path, {mode}", total_requests, 2.0, False))
    what = f"estimated RU per activity (cleanup included), {mode}, {args.payload} B payloads"
    print(verdict(what, total_ru, 30.0, False))


if __name__ == "__main__":
    main()
