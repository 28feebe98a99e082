"""What the due scan costs as history grows, and what each store operation costs, per backend.

``scan_due`` finds clocks, expired leases, lost activity messages and claimable outbox rows; it
runs on every beat tick, so its cost must grow with what is *due*, never with what is stored
(docs/architecture.md §4). This bench fills two fresh stores of each backend with the same 20 due clocks,
then one with 100 and the other with 10,000 completed executions (each: an ``exec`` document
and 5 step documents, none with due fields any more), and times ``scan_due`` on both in
interleaved runs (so load from elsewhere on the machine hits both alike). It prints the ratio
of the medians; target ≤ 1.5×.

Seeding: each execution is one create-only batch of its 6 documents (one round trip). With
``--lifecycle`` the exec document is first written *due* (a running lease) and then replaced
as completed without due fields, as the engine does — the realistic path, which also checks that
a document leaving the scan stops costing it anything (on Cosmos it leaves an index entry behind
that a ``lease`` scan cleans up), at twice the seeding round trips.

Backends: SQLite (a temp file) and Cosmos (``CosmosTestServer``, the ``@vercel/cosmosdb-server``
wrapper from ``celery_durable.testing``; skipped with the reason if Node/npm are missing). On
Cosmos the server's own request counters are printed too (requests and documents returned per
scan), which do not depend on how loaded the machine is.

"first scan" is the first ``scan_due`` of a fresh store object (nothing cached: on Cosmos the
scanner has no low-water mark yet and looks for the oldest bucket with one cross-partition
query); it is reported, not part of the ratio.

The second table: latency of single operations on the large store (p50 / p95 over ``--ops``
calls): read, create, replace, batch of 5 creates, query_partition of a 6-document execution,
scan_due (20 due).

    python bench/scan_cost.py                       # sqlite and cosmos, 100 vs 10,000
    python bench/scan_cost.py --backends sqlite     # one backend
    python bench/scan_cost.py --quick               # 100 vs 2,000, fewer runs
    python bench/scan_cost.py --lifecycle           # seed through the due -> completed path
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import machine, percentile, print_table, verdict

from celery_durable.errors import ConflictError, StoreUnavailable
from celery_durable.stores import Op, Store, store_from_url

TARGET_RATIO = 1.5


def fmt_ms(seconds: float) -> str:
    """Milliseconds, with enough digits for SQLite's sub-millisecond calls."""
    ms = seconds * 1000
    return f"{ms:.3f}" if ms < 1 else f"{ms:.1f}"


DUE_KIND = "clock"


@dataclass
class Backend:
    """Opens fresh, empty stores of one kind; ``stats``/``reset_stats`` count server requests."""

    name: str
    open_store: Callable[[], Store]
    seed_threads: int = 1
    stats: Callable[[], dict[str, Any]] | None = None
    reset_stats: Callable[[], None] | None = None


@contextmanager
def sqlite_backend() -> Iterator[Backend]:
    tmp = Path(tempfile.mkdtemp(prefix="celery-durable-scan-"))
    stores: list[Store] = []

    def open_store() -> Store:
        stores.append(store_from_url(f"sqlite:///{tmp / f'durable-{len(stores)}.db'}"))
        return stores[-1]

    try:
        yield Backend("sqlite", open_store)  # one writer at a time anyway: no seeding threads
    finally:
        for store in stores:
            store.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def cosmos_backend() -> Iterator[Backend]:
    from celery_durable.testing.cosmos_server import CosmosTestServer

    with CosmosTestServer() as server:
        stores: list[Store] = []

        def open_store() -> Store:
            # a long request timeout: a fresh scanner's first query may be slow on the test server
            url = server.url_for("bench", f"scan{uuid.uuid4().hex[:8]}", timeout=300)
            stores.append(store_from_url(url))
            return stores[-1]

        try:
            # the Node server is single-threaded but each request waits on the network: overlap them
            yield Backend("cosmos", open_store, seed_threads=8, stats=server.stats, reset_stats=server.reset_stats)
        finally:
            for store in stores:
                store.close()


BACKENDS: dict[str, Callable[[], AbstractContextManager[Backend]]] = {
    "sqlite": sqlite_backend,
    "cosmos": cosmos_backend,
}


# --- seeding ---------------------------------------------------------------------------------


def seed_due(store: Store, count: int, now: float) -> None:
    for i in range(count):
        store.create({"pk": f"due-{i:03d}", "id": "clock:1", "due_kind": DUE_KIND, "due_at": now - 60 - i})


def execution_docs(n: int, steps: int) -> list[dict[str, Any]]:
    pk = f"exec-{n:06d}"
    docs: list[dict[str, Any]] = [
        {"pk": pk, "id": "exec", "workflow": "bench.flow", "status": "completed", "result": {"ok": True, "n": n}}
    ]
    docs += [{"pk": pk, "id": f"act:step:{s}", "result": {"value": s, "pad": "x" * 64}} for s in range(1, steps + 1)]
    return docs


def seed_execution(store: Store, n: int, steps: int, lifecycle: bool, now: float) -> None:
    """Write one execution; a dropped connection is retried (a conflict then means it landed)."""
    for attempt in range(3):
        try:
            _write_execution(store, n, steps, lifecycle, now)
            return
        except StoreUnavailable:
            if attempt == 2:
                raise
            time.sleep(0.5 * (attempt + 1))
        except ConflictError:
            if attempt == 0:
                raise
            return


def _write_execution(store: Store, n: int, steps: int, lifecycle: bool, now: float) -> None:
    docs = execution_docs(n, steps)
    pk, exec_doc = docs[0]["pk"], docs[0]
    if lifecycle:
        running = dict(exec_doc, status="running", due_kind="lease", due_at=now + 3600)
        etags = store.batch(pk, [Op.create(running), *(Op.create(d) for d in docs[1:])])
        store.replace(exec_doc, if_match=etags[0])  # completed: the due fields are gone
    else:
        store.batch(pk, [Op.create(d) for d in docs])


def seed_executions(
    backend: Backend, store: Store, start: int, stop: int, steps: int, lifecycle: bool, now: float
) -> float:
    began = time.perf_counter()
    if backend.seed_threads <= 1:
        for n in range(start, stop):
            seed_execution(store, n, steps, lifecycle, now)
    else:
        with ThreadPoolExecutor(backend.seed_threads) as pool:
            for _ in pool.map(lambda n: seed_execution(store, n, steps, lifecycle, now), range(start, stop)):
                pass
    return time.perf_counter() - began


# --- measuring -----------------------------------------------------------------------------


@dataclass
class ScanResult:
    executions: int
    store: Store
    found: int = 0
    first_s: float = 0.0
    runs_s: list[float] = field(default_factory=list)
    requests: float | None = None
    docs_returned: float | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)


def prepare_scan(backend: Backend, result: ScanResult, due: int) -> None:
    """Warm the store up, check what the scan finds, and count its requests if we can."""
    began = time.perf_counter()
    found = result.store.scan_due(DUE_KIND, time.time())  # a fresh scanner: nothing cached yet
    result.first_s = time.perf_counter() - began
    for _ in range(5):  # connections, caches, the scanner's low-water mark
        found = result.store.scan_due(DUE_KIND, time.time())
    if len(found) != due:
        raise AssertionError(f"{backend.name}: scan found {len(found)} due documents, expected {due}")
    result.found = len(found)
    if backend.reset_stats is not None and backend.stats is not None:
        backend.reset_stats()
        result.store.scan_due(DUE_KIND, time.time())
        stats = backend.stats()
        result.requests, result.docs_returned = float(stats.get("total", 0)), float(stats.get("queryDocs", 0))


def measure_scans(results: list[ScanResult], runs: int, per_run: int) -> None:
    """``runs`` timed runs of ``per_run`` scans on each store, interleaved (rotating order) so that
    load from elsewhere on the machine hits every size alike."""
    for r in range(runs):
        for k in range(len(results)):
            res = results[(r + k) % len(results)]
            began = time.perf_counter()
            for _ in range(per_run):
                res.store.scan_due(DUE_KIND, time.time())
            res.runs_s.append((time.perf_counter() - began) / per_run)


def measure_ops(backend: Backend, store: Store, count: int, executions: int) -> dict[str, list[float]]:
    """Latency samples of single operations on the seeded store (every write on a new id)."""
    tag = uuid.uuid4().hex[:6]
    samples: dict[str, list[float]] = {
        k: [] for k in ("read", "create", "replace", "batch (5 creates)", "query_partition (6 docs)", "scan_due")
    }

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        began = time.perf_counter()
        out = fn(*args)
        samples[name].append(time.perf_counter() - began)
        return out

    for i in range(count):
        pk = f"exec-{(i * 7919) % executions:06d}"  # spread over the stored executions
        new_pk = f"ops-{tag}-{i}"
        timed("read", store.read, pk, "exec")
        etag = timed("create", store.create, {"pk": new_pk, "id": "exec", "status": "running", "n": i})
        timed("replace", store.replace, {"pk": new_pk, "id": "exec", "status": "completed", "n": i}, etag)
        ops = [Op.create({"pk": new_pk, "id": f"act:step:{s}", "result": s}) for s in range(5)]
        timed("batch (5 creates)", store.batch, new_pk, ops)
        read = timed("query_partition (6 docs)", store.query_partition, pk)
        if len(read.docs) != 6:
            raise AssertionError(f"{backend.name}: partition {pk} holds {len(read.docs)} docs, expected 6")
        timed("scan_due", store.scan_due, DUE_KIND, time.time())
    return samples


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backends", default="sqlite,cosmos", help="comma-separated: sqlite, cosmos")
    parser.add_argument("--small", type=int, default=100, help="completed executions, first measurement")
    parser.add_argument("--large", type=int, default=10_000, help="completed executions, second measurement")
    parser.add_argument("--steps", type=int, default=5, help="step documents per execution")
    parser.add_argument("--due", type=int, default=20, help="due clocks (the same at both sizes)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per size (median taken)")
    parser.add_argument("--per-run", type=int, default=20, help="scans per timed run")
    parser.add_argument("--ops", type=int, default=100, help="samples per operation in the latency table")
    parser.add_argument("--lifecycle", action="store_true", help="seed execs as due, then completed (2 writes)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 vs 2,000, fewer runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.large, args.runs, args.per_run, args.ops = min(args.large, 2000), 3, 10, 30
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or args.large <= args.small:
        parser.error(f"unknown backend(s) {unknown}" if unknown else "--large must exceed --small")

    print(f"scan_cost: {machine()}")
    print(
        f"{args.due} due clocks; completed executions of 1 exec + {args.steps} step docs "
        f"({'due, then completed' if args.lifecycle else 'create-only batch'}); "
        f"scan_due median of {args.runs} runs x {args.per_run} scans"
    )
    scan_rows: list[list[object]] = []
    op_tables: dict[str, dict[str, list[float]]] = {}
    ratios: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name in names:
        with ExitStack() as stack:
            try:
                backend = stack.enter_context(BACKENDS[name]())
            except Exception as exc:  # e.g. Node/npm missing for the Cosmos test server
                skipped[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                continue
            now = time.time()
            small = ScanResult(args.small, backend.open_store())
            large = ScanResult(args.large, backend.open_store())
            for res in (small, large):
                seed_due(res.store, args.due, now)
                took = seed_executions(backend, res.store, 0, res.executions, args.steps, args.lifecycle, now)
                print(f"  {name}: seeded {res.executions:,} executions in {took:.1f} s", flush=True)
                prepare_scan(backend, res, args.due)
            measure_scans([small, large], args.runs, args.per_run)
            ratios[name] = large.median_s / small.median_s
            for res in (small, large):
                docs = res.executions * (1 + args.steps) + args.due
                cells: list[object] = [name, f"{res.executions:,}", f"{docs:,}", res.found, fmt_ms(res.median_s)]
                cells += [fmt_ms(min(res.runs_s)), fmt_ms(max(res.runs_s)), fmt_ms(res.first_s)]
                cells += ["-" if res.requests is None else f"{res.requests:g}"]
                cells += ["-" if res.docs_returned is None else f"{res.docs_returned:g}"]
                cells += ["" if res is small else f"{ratios[name]:.2f}x"]
                scan_rows.append(cells)
            op_tables[name] = measure_ops(backend, large.store, args.ops, args.large)

    print_table(
        ["backend", "executions", "docs stored", "due found", "scan ms (median)", "min", "max", "first scan ms",
         "requests", "docs ret.", "large/small"],
        scan_rows,
        title="scan_due with few vs many completed executions stored",
    )  # fmt: skip
    if op_tables:
        ops = list(next(iter(op_tables.values())))
        rows = []
        for op in ops:
            row: list[object] = [op]
            for name in op_tables:
                values = op_tables[name][op]
                row += [fmt_ms(percentile(values, 50)), fmt_ms(percentile(values, 95))]
            rows.append(row)
        headers = ["operation"] + [f"{n} {q}" for n in op_tables for q in ("p50 ms", "p95 ms")]
        print_table(
            headers, rows, title=f"operation latency with {args.large:,} executions stored ({args.ops} samples)"
        )
    for name, reason in skipped.items():
        print(f"\n{name}: skipped ({reason})")
    print(f"\nend: {machine()}")
    if not ratios:
        print("scan_due large/small -> MISS (no backend ran)")
        return 1
    ok = True
    for name, ratio in ratios.items():
        line = verdict(f"{name} scan_due {args.large:,}/{args.small:,} executions", ratio, TARGET_RATIO, False)
        ok = ok and line.endswith("PASS")
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
