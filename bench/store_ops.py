"""Store round trips and documents read per activity, at 10 and at 1,000 sequential steps.

The engine runs in-process (``InlineDispatcher`` + ``LocalWorker``: no broker, no Celery) on a
real :class:`~celery_durable.stores.sqlite.store.SqliteStore` wrapped in a counting proxy. Every call
to the store is one round trip; each is attributed to the engine function that made it (the
first caller frame in ``celery_durable/engine`` outside the partition cache).

* round trips per activity: all store calls of a run / activities, and the marginal figure
  (minus the workflow's fixed start: create, first read, first commit) that the target is about.
* documents read per activity: documents returned by ``query_partition`` plus point reads that
  found something, / activities. Replay re-runs the workflow from the top on every drive, so
  without the partition cache this would grow with the step count (O(n^2) per workflow); with it
  it must stay flat: the 1,000/10 ratio should be ~1.
* wall time per step: the whole run / activities (replay CPU included, which is O(n) per drive).

Heartbeats are pushed out of the way (lease TTL 600 s, heartbeat 300 s) so the counts are those
of the common path, independent of how long the run takes.

    python bench/store_ops.py                 # 10 and 1,000 steps on SQLite
    python bench/store_ops.py --store both    # ... and on the in-memory store
    python bench/store_ops.py --store sqlite,postgres   # SQLite and PostgreSQL in one run
                                              # ($BENCH_POSTGRES_URL, default 127.0.0.1:5432/test;
                                              # a fresh schema, dropped at the end)
    python bench/store_ops.py --quick         # 10 and 200 steps
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import exit_on_sigterm, machine, print_table, verdict

from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.documents.model import Settings
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.replay.context import require_context
from celery_durable.stores.base import Doc, DueRef, Op, PartitionRead, Store

WRITES = ("create", "replace", "upsert", "delete", "batch")


def _call_site() -> str:
    """``module.function`` of the engine code that called the store (skipping the cache)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        cache = path.endswith("/engine/drive/partition_cache.py")
        if "/celery_durable/" in path and "/stores/" not in path and not cache:
            module = path.rsplit("/", 1)[-1].removesuffix(".py")
            return f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "bench"


@dataclass
class Tally:
    calls: Counter[str] = field(default_factory=Counter)
    by_site: Counter[tuple[str, str]] = field(default_factory=Counter)
    docs_read: int = 0
    docs_written: int = 0

    def total(self) -> int:
        return sum(self.calls.values())


class CountingStore(Store):
    """Delegates to a real store and counts every call (one call = one round trip)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.max_doc_bytes = inner.max_doc_bytes
        self.max_batch_ops = inner.max_batch_ops
        self.tally = Tally()

    def reset(self) -> Tally:
        tally, self.tally = self.tally, Tally()
        return tally

    def _count(self, op: str) -> None:
        self.tally.calls[op] += 1
        self.tally.by_site[(_call_site(), op)] += 1

    def read(self, pk: str, doc_id: str) -> Doc | None:
        self._count("read")
        doc = self.inner.read(pk, doc_id)
        self.tally.docs_read += doc is not None
        return doc

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        self._count("read_many")
        docs = self.inner.read_many(pk, ids)
        self.tally.docs_read += sum(doc is not None for doc in docs)
        return docs

    def create(self, doc: Doc) -> str | None:
        self._count("create")
        self.tally.docs_written += 1
        return self.inner.create(doc)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        self._count("replace")
        self.tally.docs_written += 1
        return self.inner.replace(doc, if_match)

    def upsert(self, doc: Doc) -> str:
        self._count("upsert")
        self.tally.docs_written += 1
        return self.inner.upsert(doc)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        self._count("delete")
        return self.inner.delete(pk, doc_id, if_match)

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        self._count("query_partition")
        read = self.inner.query_partition(pk, since)
        self.tally.docs_read += len(read.docs)
        return read

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._count("batch")
        self.tally.docs_written += len(ops)
        return self.inner.batch(pk, ops)

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        self._count("scan_due")
        return self.inner.scan_due(kind, now, limit)

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        self._count("scan_partitions")
        return self.inner.scan_partitions(pk_prefix, limit)

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        self.inner.close()


POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def make_store(kind: str, tmp: Path) -> tuple[Store, str]:
    if kind == "postgres":
        from celery_durable.stores.postgres.store import from_url

        schema = f"bench_{uuid.uuid4().hex[:12]}"
        sep = "&" if "?" in POSTGRES_URL else "?"
        return from_url(f"{POSTGRES_URL}{sep}schema={schema}"), "PostgresStore"
    if kind == "sqlite":
        try:
            from celery_durable.stores.sqlite.store import SqliteStore
        except ImportError as exc:
            print(f"celery_durable.stores.sqlite.store is not importable ({exc}); falling back to MemoryStore")
        else:
            return SqliteStore(str(tmp / "store_ops.db")), "SqliteStore"
    from celery_durable.stores.memory import MemoryStore

    return MemoryStore(), "MemoryStore"


@dataclass
class Result:
    store: str
    steps: int
    executions: int
    tally: Tally
    seconds: float

    @property
    def activities(self) -> int:
        return self.steps * self.executions

    def per_act(self, value: float) -> float:
        return value / self.activities


class Bench:
    def __init__(self, store: CountingStore, eager: bool = True) -> None:
        self.store = store
        # eager: as a worker with durable_eager_activities (the default): the next activity runs
        # in the process that committed it, its lease taken by that commit
        self.dispatcher = InlineDispatcher(eager=eager)
        self.registry = Registry()
        settings = Settings(lease_ttl=600.0, heartbeat_interval=300.0)
        self.engine = Engine(store, self.dispatcher, self.registry, settings)
        self.worker = LocalWorker(self.engine, self.dispatcher)

        def step_fn(x: int) -> int:
            return x + 1

        act = self.registry.add_activity("bench.step", step_fn)

        def step(x: int) -> int:
            ctx = require_context("bench.step")
            value: int = ctx.call_activity(act.name, act.codec, (x,), {}).result()
            return value

        def sequential(n: int) -> int:
            x = 0
            for _ in range(n):
                x = step(x)
            return x

        self.workflow = self.registry.add_workflow("bench.sequential", sequential)

    def run(self, steps: int, executions: int, label: str) -> Result:
        self.store.reset()
        ids: list[str] = []
        t0 = time.perf_counter()
        for _ in range(executions):
            eid, _ = self.engine.start(self.workflow, (steps,), {})
            self.worker.run()
            ids.append(eid)
        seconds = time.perf_counter() - t0
        tally = self.store.reset()
        for eid in ids:
            ex = self.engine.read_exec(eid)
            if ex.get("status") != "completed" or ex.get("result") != steps:
                raise AssertionError(f"{eid}: {ex.get('status')} {ex.get('result')!r} {ex.get('error')}")
        self.store.reset()
        return Result(label, steps, executions, tally, seconds)

    def close(self) -> None:
        self.engine.leases.stop(release=False)
        self.store.close()


def report(results: list[Result], sizes: tuple[int, int]) -> tuple[float, float]:
    small, large = sizes
    ops = sorted({op for r in results for op in r.tally.calls})
    rows = []
    for r in results:
        rows.append(
            [
                f"{r.store} {r.steps} steps x {r.executions}",
                r.activities,
                f"{r.per_act(r.tally.total()):.2f}",
                *[f"{r.per_act(r.tally.calls[op]):.2f}" for op in ops],
                f"{r.per_act(r.tally.docs_read):.2f}",
                f"{r.per_act(r.tally.docs_written):.2f}",
                f"{r.per_act(r.seconds) * 1e3:.3f}",
                f"{r.activities / r.seconds:,.0f}",
            ]
        )
    print_table(
        ["run", "activities", "round trips/act", *[f"{op}/act" for op in ops], "docs read/act", "docs written/act",
         "ms/step", "steps/s"],
        rows,
        title="Store calls per activity (sequential workflow, in-process engine)",
    )  # fmt: skip

    # where the round trips come from, at the large size on the first store
    first = next(r for r in results if r.steps == large)
    site_rows = [
        [site, op, n, f"{first.per_act(n):.3f}"]
        for (site, op), n in sorted(first.tally.by_site.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    print_table(
        ["engine call site", "op", "calls", "per activity"],
        site_rows,
        title=f"Round trips by call site ({first.store}, {first.steps} steps)",
    )

    by_key = {(r.store, r.steps): r for r in results}
    flat_rows = []
    for store in dict.fromkeys(r.store for r in results):
        a, b = by_key[(store, small)], by_key[(store, large)]
        reads_ratio = b.per_act(b.tally.docs_read) / a.per_act(a.tally.docs_read)
        rt_ratio = b.per_act(b.tally.total()) / a.per_act(a.tally.total())
        time_ratio = b.per_act(b.seconds) / a.per_act(a.seconds)
        flat_rows.append([store, f"{reads_ratio:.2f}", f"{rt_ratio:.2f}", f"{time_ratio:.2f}"])
    print_table(
        ["store", "docs read/act ratio", "round trips/act ratio", "ms/step ratio"],
        flat_rows,
        title=f"Flatness: {large} steps / {small} steps (1.00 = flat)",
    )
    a, b = by_key[(results[0].store, small)], by_key[(results[0].store, large)]
    # a workflow's fixed cost (the start's create and its first drive: a read and a commit) is
    # not an activity's: the per-activity figure is the marginal cost of one more step
    marginal = (b.tally.total() - 3 * b.executions) / b.activities
    print(
        f"\nper workflow: 3 round trips to start (create, first drive's read and commit); "
        f"per activity after that: {marginal:.2f}"
    )
    return marginal, b.per_act(b.tally.docs_read) / a.per_act(a.tally.docs_read)


def _drop_schema(store: Store) -> None:
    import psycopg

    from celery_durable.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    schema = store.cfg.schema
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    print(f"{machine()} at the start", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="celery-durable-store-ops-"))
    results: list[Result] = []
    kinds = ["sqlite", "memory"] if args.store == "both" else args.store.split(",")
    unknown = set(kinds) - {"sqlite", "memory", "postgres"}
    if unknown:
        raise SystemExit(f"unknown --store {', '.join(sorted(unknown))} (sqlite, memory, postgres, both)")
    sizes = (args.small, args.large)
    try:
        for kind in kinds:
            inner, label = make_store(kind, tmp)
            bench = Bench(CountingStore(inner), eager=not args.delivered)
            try:
                bench.run(3, 2, label)  # warm-up: schema, codecs, caches
                runs: list[tuple[int, int]] = [(args.small, args.small_executions), (args.large, 1)]
                for steps, executions in runs:
                    results.append(bench.run(steps, executions, label))
            finally:
                bench.close()
                if kind == "postgres":
                    _drop_schema(inner)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nstore_ops: one sequential workflow of N trivial activities, engine in-process "
        f"(InlineDispatcher + LocalWorker), store: {', '.join(dict.fromkeys(r.store for r in results))}, "
        f"{'every activity delivered' if args.delivered else 'eager activities (the default)'}"
    )
    round_trips, flat = report(results, sizes)
    print(f"run time {time.perf_counter() - t_start:.1f} s; {machine()} at the end")
    print(
        verdict(f"round trips per activity ({results[0].store}, {args.large} steps, marginal)", round_trips, 2.0, False)
    )
    print(verdict(f"docs read per activity, {args.large}/{args.small} steps", flat, 1.2, False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--store", default="sqlite", help="sqlite, memory, postgres, a comma list of them, or both (sqlite,memory)"
    )
    parser.add_argument("--small", type=int, default=10, help="steps of the small workflow (default 10)")
    parser.add_argument("--small-executions", type=int, default=20, help="small workflows run (default 20)")
    parser.add_argument("--large", type=int, default=1000, help="steps of the large workflow (default 1000)")
    parser.add_argument("--quick", action="store_true", help="large workflow of 200 steps, 5 small ones")
    parser.add_argument(
        "--delivered", action="store_true", help="every activity delivered by a message (durable_eager_activities = 0)"
    )
    args = parser.parse_args()
    exit_on_sigterm()
    if args.quick:
        args.large, args.small_executions = 200, 5
    run(args)


if __name__ == "__main__":
    main()
