"""SQLite write contention: N processes × M small write transactions on one store file.

Each writer runs ``SqliteStore.batch`` in a loop: one ``BEGIN IMMEDIATE``, two upserts of ~500-byte
JSON documents, ``COMMIT`` (the shape of an outbox enqueue or a workflow commit). All writers start
together (a barrier, after one warm-up write that opens their connections). Two regimes (``--gaps``,
one table each): back to back (0 ms: the lock is never idle, the CPU is oversubscribed), and 2 ms
asleep between a writer's writes (as a worker or client waiting on its broker between writes: the
lock is often free, and what matters is how soon a waiter notices). ``--layout 8x1+1x4`` is the
outbox bench's writers (2 workers × prefork 4 + a 4-thread client).

Variants, each on a fresh file:

* ``sqlite-handler`` — before: SQLite's own busy handler (``timeout=``), which sleeps
  1, 2, 5, 10, 15, 20, 25 … ms between tries for the lock;
* ``store`` — ``SqliteStore`` as it is: no busy handler on writer connections, our own retry of
  ``BEGIN IMMEDIATE`` after short randomized sleeps (``WAIT_FIRST`` doubling to ``WAIT_MAX``);
* ``--explore`` adds other sleep schedules (constant 1 ms as the Rails/sqlite3-ruby handler, other
  caps) and ``store+plock`` (threads of one process queue on a lock before trying the file's lock);
* ``alone`` — ``store`` with a single writer: what a write costs without contention.

Per variant: writes/s (all writes / span from the first start to the last end), mean / p50 /
p99 / max latency of one batch, errors (``StoreUnavailable``: the busy timeout ran out). Rounds
repeat every variant (order rotated per round); the table shows the median round and the min–max
spread. The verdict: p99 of ``store`` / p99 of ``sqlite-handler`` in the last (largest-gap) table.

    python bench/sqlite_contention.py                       # 9 processes x 400 writes, gaps 0 and 2 ms, 3 rounds
    python bench/sqlite_contention.py --layout 8x1+1x4      # 8 single-thread processes + one with 4 threads
    python bench/sqlite_contention.py --explore --rounds 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from _common import exit_on_sigterm, machine, mean, percentile, verdict

from celery_durable.errors import StoreUnavailable
from celery_durable.stores.base import Op
from celery_durable.stores.sqlite.store import SqliteStore


class SqliteHandlerStore(SqliteStore):
    """The store before: every connection (writers too) waits through SQLite's busy handler."""

    @contextmanager
    def _conn(self, writer: bool = False) -> Iterator[Any]:
        with super()._conn(False) as conn:  # the readers' pool: connections with timeout=busy_timeout
            yield conn

    def _begin(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")


def schedule(first: float, cap: float) -> type[SqliteStore]:
    """``SqliteStore`` with another sleep schedule for the write lock."""
    return type(f"Wait{first}_{cap}", (SqliteStore,), {"_wait_first": first, "_wait_max": cap})


class ProcessLockStore(SqliteStore):
    """Threads of one process take a process-local lock first: one of them polls the file's lock."""

    def __init__(self, path: str, **kw: Any) -> None:
        super().__init__(path, **kw)
        self._writing = threading.Lock()

    @contextmanager
    def _write(self) -> Iterator[Any]:
        # advisory only: past the busy timeout go on without it (SQLite's lock is the real one)
        held = self._writing.acquire(timeout=self.busy_timeout)
        try:
            with super()._write() as conn:
                yield conn
        finally:
            if held:
                self._writing.release()


VARIANTS: dict[str, type[SqliteStore]] = {"sqlite-handler": SqliteHandlerStore, "store": SqliteStore}
EXPLORE: dict[str, type[SqliteStore]] = {
    "const 1 ms": schedule(1e-3, 1e-3),
    "0.1 -> 0.5 ms": schedule(100e-6, 500e-6),
    "0.1 -> 5 ms": schedule(100e-6, 5e-3),
    "0.05 -> 1 ms": schedule(50e-6, 1e-3),
    "store+plock": ProcessLockStore,
}
ALL = VARIANTS | EXPLORE


@dataclass
class Result:
    latencies: list[float]
    start: float
    end: float
    errors: int


def _doc(pk: str, doc_id: str, i: int) -> dict[str, Any]:
    # ~500 bytes of JSON, as an outbox row or an execution header
    return {"pk": pk, "id": doc_id, "status": "pending", "seq": i, "attempt": 0, "data": "x" * 420}


def _writer(store: SqliteStore, name: str, job: Job, barrier: Barrier, out: Any) -> None:
    store.batch(f"{name}-warm", [Op.upsert(_doc(f"{name}-warm", "a", 0))])  # connections opened
    barrier.wait()
    latencies: list[float] = []
    errors = 0
    start = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes on one machine
    for i in range(job.writes):
        pk = f"{name}-{i % 50}"
        ops = [Op.upsert(_doc(pk, "exec", i)), Op.upsert(_doc(pk, "outbox:1", i))]
        t0 = time.perf_counter()
        try:
            store.batch(pk, ops)
        except StoreUnavailable:
            errors += 1
        done = time.perf_counter()
        latencies.append(done - t0)
        while time.perf_counter() - done < job.cpu:  # the caller's own work between writes ...
            pass
        if job.gap:
            time.sleep(job.gap)  # ... and its waits (a broker round trip)
    out.put(Result(latencies, start, time.monotonic(), errors))


@dataclass(frozen=True)
class Job:
    variant: str
    path: str
    busy_timeout: float
    writes: int
    gap: float  # seconds asleep between two writes of one writer
    cpu: float  # seconds of CPU work between two writes


def _process(job: Job, proc: int, threads: int, barrier: Barrier, out: Any) -> None:
    store = ALL[job.variant](job.path, busy_timeout=job.busy_timeout)
    names = [f"p{proc}t{t}" for t in range(threads)]
    workers = [threading.Thread(target=_writer, args=(store, name, job, barrier, out)) for name in names]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    store.close()


def parse_layout(layout: str) -> list[int]:
    """``8x1+1x4`` -> threads per process: [1, 1, 1, 1, 1, 1, 1, 1, 4]."""
    procs: list[int] = []
    for term in layout.split("+"):
        count, _, threads = term.partition("x")
        procs += [int(threads or 1)] * int(count)
    return procs


def run_once(job: Job, procs: list[int]) -> dict[str, float]:
    """One race of ``sum(procs)`` writers on a fresh file: throughput and latency figures."""
    tmp = Path(tempfile.mkdtemp(prefix="celery-durable-contention-"))
    try:
        job = replace(job, path=str(tmp / "durable.db"))
        setup = SqliteStore(job.path)
        setup.read("setup", "setup")  # the file and its schema exist before the race
        setup.close()
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(sum(procs))
        out = ctx.Queue()
        children = [ctx.Process(target=_process, args=(job, i, t, barrier, out)) for i, t in enumerate(procs)]
        for c in children:
            c.start()
        try:
            results = [out.get(timeout=600) for _ in range(sum(procs))]
        finally:
            for c in children:
                c.join(60)
                if c.is_alive():
                    c.kill()
        if any(c.exitcode != 0 for c in children):
            raise RuntimeError(f"writer processes exited with {[c.exitcode for c in children]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lat = [x for r in results for x in r.latencies]
    span = max(r.end for r in results) - min(r.start for r in results)
    return {
        "rate": len(lat) / span,
        "mean": mean(lat),
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "max": max(lat),
        "errors": sum(r.errors for r in results),
    }


Runs = dict[str, list[dict[str, float]]]


def spread(rounds: list[dict[str, float]], key: str, scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    values = [r[key] * scale for r in rounds]
    med = statistics.median(values)
    return fmt.format(med) + (f" ({fmt.format(min(values))}–{fmt.format(max(values))})" if len(values) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="9x1", help="processes x threads, '+'-joined (default 9x1)")
    parser.add_argument("--writes", type=int, default=400, help="write transactions per writer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-timeout", type=float, default=5.0)
    parser.add_argument("--gaps", default="0,2", help="ms a writer sleeps between writes; one table each")
    parser.add_argument("--cpu-ms", type=float, default=0.0, help="ms of CPU work between writes")
    parser.add_argument("--explore", action="store_true", help="also other sleep schedules and a process lock")
    parser.add_argument("--variants", default="", help="comma list of variants to run (overrides --explore)")
    args = parser.parse_args()
    exit_on_sigterm()
    procs = parse_layout(args.layout)
    names = [v for v in args.variants.split(",") if v] or list(ALL if args.explore else VARIANTS)
    unknown = set(names) - set(ALL)
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}; known: {sorted(ALL)}")
    print(f"{machine()} at the start")
    sections: dict[float, Runs] = {}
    for gap in sorted(float(g) for g in args.gaps.split(",")):
        runs: Runs = {name: [] for name in [*names, "alone"]}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # order rotated per round
                job = Job(name, "", args.busy_timeout, args.writes, gap / 1000, args.cpu_ms / 1000)
                runs[name].append(run_once(job, procs))
            alone = Job("store", "", args.busy_timeout, args.writes, gap / 1000, args.cpu_ms / 1000)
            runs["alone"].append(run_once(alone, [1]))
        sections[gap] = runs
        print_section(runs, args, procs, gap)
    print(f"{machine()} at the end")
    gap, runs = max(sections.items())
    if "store" in runs and "sqlite-handler" in runs:
        pairs = zip(runs["store"], runs["sqlite-handler"], strict=True)
        ratio = statistics.median(s["p99"] / h["p99"] for s, h in pairs)
        label = f"p99 latency store/sqlite-handler ({sum(procs)} writers, {gap:g} ms gaps, median round)"
        print(verdict(label, ratio, 0.5, higher_is_better=False))


def print_section(runs: Runs, args: argparse.Namespace, procs: list[int], gap: float) -> None:
    from rich.console import Console
    from rich.table import Table

    between = f"{gap:g} ms asleep" + (f" + {args.cpu_ms:g} ms CPU" if args.cpu_ms else "") + " between writes"
    table = Table(
        title=f"{sum(procs)} writers ({args.layout}) x {args.writes} batches (2 upserts of ~500 B) on one SQLite file, "
        f"{between}; median of {args.rounds} rounds (min–max)"
    )
    for h in ("variant", "writes/s", "mean ms", "p50 ms", "p99 ms", "max ms", "errors"):
        table.add_column(h, justify="left" if h == "variant" else "right")
    for name, rounds in runs.items():
        table.add_row(
            name + (" (1 writer)" if name == "alone" else ""),
            spread(rounds, "rate"),
            spread(rounds, "mean", 1000, "{:.2f}"),
            spread(rounds, "p50", 1000, "{:.2f}"),
            spread(rounds, "p99", 1000, "{:.1f}"),
            spread(rounds, "max", 1000, "{:.0f}"),
            str(int(sum(r["errors"] for r in rounds))),
        )
    Console(width=160).print(table)
    if "store" in runs and "sqlite-handler" in runs:
        pairs = zip(runs["store"], runs["sqlite-handler"], strict=True)
        ratios = ", ".join(f"{s['rate'] / h['rate']:.2f}" for s, h in pairs)
        print(f"store/sqlite-handler writes/s per round: {ratios}")


if __name__ == "__main__":
    main()
