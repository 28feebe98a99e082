"""The effect outbox under load, beside plain Celery tasks running the same handler.

10,000 effects over 100 keys (``e{i}`` on key ``k{i % 100}``), 2 workers × prefork concurrency
4, Redis broker, one SQLite store file. The bench process is the client: it enqueues everything
(``durable.outbox.enqueue``), then waits for the handlers to finish. Each handler run appends a
line (mode, key, seq, start, end) to a per-process file; from those files and the rows we get

* effects/s — total effects / (last handler end − first enqueue);
* claim latency — claim time − the moment the row became claimable (its ``available_at``, or
  the settle of the previous row of its key): p50 / p99, from the rows;
* per-key order violations — adjacent runs of one key that overlap or run out of enqueue
  order (target 0).

The plain-Celery row sends the same handler as an ordinary task (``bench.plain``), same keys,
same workers, same run: no store, no ordering (its "latency" is send → start).

    python bench/outbox.py            # 10,000 effects, 100 keys
    python bench/outbox.py --quick    # 1,000 effects, 20 keys

This file is also the workers' Celery app (``celery -A outbox worker``, ``bench/`` on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from celery import Celery, signals
from pydantic import BaseModel

from celery_durable import Durable
from celery_durable.stores.sqlite.store import SqliteStore

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")

app = Celery("bench_outbox", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=4,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    durable_install_beat=False,  # the liveness scan is not what we measure
)
durable = Durable(app)

_log_file: Any = None

#: store round trips of this process (every SqliteStore call is one)
CALLS = [0]
#: with ``--sites``: the same calls by ``module.function:op`` of the outbox code that made them
SITES: Counter[str] = Counter()
_SITES_ON = bool(os.environ.get("BENCH_SITES"))


def _call_site(op: str) -> str:
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/celery_durable/" in path and "/stores/" not in path:
            return f"{path.rsplit('/', 1)[-1].removesuffix('.py')}.{frame.f_code.co_name}:{op}"
        frame = frame.f_back  # type: ignore[assignment]
    return f"bench:{op}"


def _counted(name: str) -> None:
    original = getattr(SqliteStore, name)

    def call(self: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        if _SITES_ON:
            SITES[_call_site(name)] += 1
        return original(self, *args, **kwargs)

    setattr(SqliteStore, name, call)


for _name in ("read", "read_many", "create", "replace", "upsert", "delete", "batch", "query_partition", "scan_due"):
    _counted(_name)


@signals.worker_ready.connect
def _ready(**_: object) -> None:
    ready = os.environ.get("BENCH_READY_FILE")
    if ready:
        Path(ready).write_text(str(os.getpid()))


class Item(BaseModel):
    seq: int


def handle(mode: str, key: str, seq: int, sent: float = 0.0) -> None:
    """The handler both sides run: trivial work, one line of evidence."""
    global _log_file
    start = time.time()
    if _log_file is None or _log_file[0] != os.getpid():
        folder = Path(os.environ.get("BENCH_LOG_DIR", "."))
        _log_file = (os.getpid(), (folder / f"runs-{os.getpid()}.log").open("a", buffering=1))
    # the process's store round trips so far go with each line (the bench takes differences)
    _log_file[1].write(f"{mode} {key} {seq} {start:.6f} {time.time():.6f} {sent:.6f} {os.getpid()} {CALLS[0]}\n")
    if _SITES_ON:
        tmp = folder_of_sites() / f".sites-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(SITES))
        os.replace(tmp, folder_of_sites() / f"sites-{os.getpid()}.json")


def folder_of_sites() -> Path:
    return Path(os.environ.get("BENCH_LOG_DIR", ".")).parent


def _sites(folder: Path) -> Counter[str]:
    """Every process's store calls by call site so far (``--sites``): the workers' files and ours."""
    total: Counter[str] = Counter(SITES)
    for path in folder.parent.glob("sites-*.json"):
        total.update(json.loads(path.read_text()))
    return total


@durable.effect("bench.fx")
def fx(item: Item) -> None:
    from celery_durable.glue.outbox import effect_context

    handle("outbox", effect_context().key, item.seq)


@app.task(name="bench.plain", ignore_result=True)
def plain(key: str, seq: int, sent: float) -> None:
    handle("plain", key, seq, sent)


# --- the client ------------------------------------------------------------------------------------


def _runs(folder: Path, mode: str) -> list[tuple[str, int, float, float, float]]:
    out = []
    for path in folder.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 8 and parts[0] == mode:
                out.append((parts[1], int(parts[2]), float(parts[3]), float(parts[4]), float(parts[5])))
    return out


def _worker_calls(folder: Path) -> dict[str, int]:
    """The last store round-trip count each worker process logged."""
    last: dict[str, int] = {}
    for path in folder.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 8:
                last[parts[6]] = max(last.get(parts[6], 0), int(parts[7]))
    return last


def _wait_runs(folder: Path, mode: str, n: int, timeout: float) -> list[tuple[str, int, float, float, float]]:
    deadline = time.monotonic() + timeout
    while True:
        runs = _runs(folder, mode)
        if len({(k, s) for k, s, *_ in runs}) >= n:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mode}: {len(runs)} of {n} handler runs after {timeout}s")
        time.sleep(0.2)


def order_violations(runs: list[tuple[str, int, float, float, float]]) -> int:
    """Adjacent runs of one key (by start time) that overlap or go against enqueue order."""
    by_key: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for key, seq, start, end, _ in runs:
        by_key[key].append((start, end, seq))
    bad = 0
    for spans in by_key.values():
        spans.sort()
        for (_, end, seq), (start, _, seq2) in zip(spans, spans[1:], strict=False):
            if start < end or seq2 < seq:
                bad += 1
    return bad


def _phase_outbox(
    args: argparse.Namespace, logs: Path, bulk: bool, tag: str, before_workers: dict[str, int]
) -> dict[str, Any]:
    """Enqueue n effects (one by one from ``enqueuers`` threads, or ``enqueue_many`` of 100),
    wait for every handler, and read the rows back: rate, latency, order, round trips."""
    from _common import percentile

    from celery_durable.engine.outbox import claim_latency

    n, keys, outbox = args.effects, args.keys, durable.outbox
    before_client = CALLS[0]
    before_sites = _sites(logs)

    def eid(i: int) -> str:
        return f"{tag}{i:06d}"

    def enqueue_part(part: int) -> None:
        mine = [i for i in range(n) if (i % keys) % args.enqueuers == part]
        if bulk:
            for c in range(0, len(mine), 100):
                outbox.enqueue_many(
                    [
                        {"type": "bench.fx", "payload": {"seq": i}, "key": f"k{i % keys:03d}", "effect_id": eid(i)}
                        for i in mine[c : c + 100]
                    ]
                )
        else:
            for i in mine:
                outbox.enqueue("bench.fx", {"seq": i}, key=f"k{i % keys:03d}", effect_id=eid(i))

    t0 = time.time()
    with ThreadPoolExecutor(args.enqueuers) as pool:
        list(pool.map(enqueue_part, range(args.enqueuers)))
    t_enqueued = time.time()
    runs = _wait_runs(logs, "outbox", n, args.timeout)
    end = max(r[3] for r in runs)
    client_calls = CALLS[0] - before_client
    rows = [outbox.core.get(eid(i)) for i in range(n)]
    after_workers = _worker_calls(logs)
    worker_calls = sum(v - before_workers.get(pid, 0) for pid, v in after_workers.items())
    sites = _sites(logs)
    sites.subtract(before_sites)
    latencies = [x for r in rows if r is not None and (x := claim_latency(r)) is not None]
    statuses: dict[str, int] = defaultdict(int)
    for r in rows:
        statuses[(r or {}).get("status", "missing")] += 1
    return {
        "rate": n / (end - t0),
        "submit": n / (t_enqueued - t0),
        "span": n / (end - min(r[2] for r in runs)),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "viol": order_violations(runs),
        "dups": len(runs) - len({(k, s) for k, s, *_ in runs}),
        "trips": (client_calls + worker_calls) / n,
        "statuses": dict(statuses),
        "attempts": sum(int((r or {}).get("attempt") or 0) for r in rows),
        "workers_after": after_workers,
        "sites": {site: count / n for site, count in sites.most_common() if count > 0},
    }


def _phase_latency(args: argparse.Namespace, logs: Path) -> tuple[float, float, int]:
    """Claim latency when the workers are not saturated: effects enqueued at a steady
    ``--paced-rate`` per second from one thread over all keys (p50, p99 in seconds, count)."""
    from _common import percentile

    from celery_durable.engine.outbox import claim_latency

    n, outbox = args.paced, durable.outbox
    t0 = time.perf_counter()
    for i in range(n):
        pause = t0 + i / args.paced_rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)  # pacing the load generator, not awaiting a result
        outbox.enqueue("bench.fx", {"seq": i}, key=f"k{i % args.keys:03d}", effect_id=f"p{i:06d}")
    _wait_runs(logs, "outbox", n, args.timeout)
    latencies = [x for i in range(n) if (r := outbox.core.get(f"p{i:06d}")) and (x := claim_latency(r)) is not None]
    return percentile(latencies, 50), percentile(latencies, 99), len(latencies)


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import bench_env, fmt_ms, machine, percentile, start_worker, verdict

    global _SITES_ON
    n, keys = args.effects, args.keys
    print(f"{machine()} at the start", flush=True)
    with bench_env("outbox") as env:
        logs = env.tmp / "runs"
        logs.mkdir()
        env.env["BENCH_LOG_DIR"] = str(logs)
        if args.sites:
            env.env["BENCH_SITES"] = "1"
            _SITES_ON = True
        env.apply_to_process()
        app.conf.update(broker_url=env.env["BENCH_BROKER_URL"], task_default_queue=env.queue)
        durable.configure(store=env.store_url)
        workers = [start_worker(env, app="outbox", concurrency=args.concurrency) for _ in range(args.workers)]
        try:
            outbox = durable.outbox
            # warm-up: pool children, connections, schema
            for i in range(20):
                outbox.enqueue("bench.fx", {"seq": i}, key=f"warm{i % 4}", effect_id=f"warm-{i}")
                plain.apply_async(args=[f"warm{i % 4}", i, time.time()])
            _wait_runs(logs, "outbox", 20, 120)
            _wait_runs(logs, "plain", 20, 120)
            counted = _worker_calls(logs)
            for path in logs.glob("runs-*.log"):
                path.write_text("")

            one = _phase_outbox(args, logs, bulk=False, tag="e", before_workers=counted)
            for path in logs.glob("runs-*.log"):
                path.write_text("")
            many = _phase_outbox(args, logs, bulk=True, tag="m", before_workers=one["workers_after"])
            for path in logs.glob("runs-*.log"):
                path.write_text("")
            paced = _phase_latency(args, logs)
            for path in logs.glob("runs-*.log"):
                path.write_text("")

            # plain Celery, same handler, same keys, same workers
            t1 = time.time()
            for i in range(n):
                plain.apply_async(args=[f"k{i % keys:03d}", i, time.time()])
            t_sent = time.time()
            plain_runs = _wait_runs(logs, "plain", n, args.timeout)
            plain_end = max(r[3] for r in plain_runs)
            plain_lat = [start - sent for _, _, start, _, sent in plain_runs]
        finally:
            for w in workers:
                w.stop()
            durable.shutdown()

    plain_rate = n / (plain_end - t1)
    print(
        f"\n{n} effects over {keys} keys; {args.workers} workers x prefork -c {args.concurrency}; Redis broker, "
        f"SQLite store; handler = one log line; {args.enqueuers} enqueuer threads\n"
        "items/s: n / (last handler end - first submit); run span/s: n / (last end - first start); "
        "round trips: store calls of the client and the workers / n"
    )
    rows = []
    for label, r in (("outbox, enqueue one by one", one), ("outbox, enqueue_many (100)", many)):
        rows.append(
            [
                label,
                f"{r['rate']:.1f}",
                f"{r['rate'] / plain_rate:.2f}x",
                f"{r['submit']:.1f}",
                fmt_ms(r["p50"]),
                fmt_ms(r["p99"]),
                f"{r['trips']:.2f}",
                r["viol"],
                r["dups"],
            ]
        )
    rows.append(
        [
            "plain Celery task (send -> run)",
            f"{plain_rate:.1f}",
            "1.00x",
            f"{n / (t_sent - t1):.1f}",
            fmt_ms(percentile(plain_lat, 50)),
            fmt_ms(percentile(plain_lat, 99)),
            "-",
            order_violations(plain_runs),
            len(plain_runs) - len({(k, s) for k, s, *_ in plain_runs}),
        ]
    )
    print_rich_table(
        [
            "variant",
            "items/s",
            "vs plain",
            "submit/s",
            "latency p50 ms",
            "latency p99 ms",
            "round trips",
            "order viol.",
            "dups",
        ],
        rows,
        "Throughput, claim latency (outbox: claimable -> claimed; plain: sent -> started), per-key order",
    )
    for label, r in (("one by one", one), ("enqueue_many", many)):
        print(
            f"outbox rows ({label}): {r['statuses']}; attempts {r['attempts']} for {n} effects; "
            f"run span {r['span']:.1f}/s"
        )
    if args.sites:
        for label, r in (("one by one", one), ("enqueue_many", many)):
            print(
                f"store round trips an effect by call site ({label}; the workers' settles after their last handler "
                "line are not counted):"
            )
            for site, per in r["sites"].items():
                print(f"  {per:6.3f}  {site}")
    print(f"{machine()} at the end")
    print(verdict("outbox per-key order violations", one["viol"] + many["viol"], 0, higher_is_better=False))
    print(
        verdict("outbox/plain Celery throughput (enqueue_many)", many["rate"] / plain_rate, 0.8, higher_is_better=True)
    )
    # one by one, an enqueue to an idle key sends a Celery message (what a whole plain task costs
    # the client) on top of its three store writes/reads: its ceiling here is about 0.6-0.7x
    print(
        f"outbox/plain Celery throughput (one by one) = {one['rate'] / plain_rate:.2f} "
        f"(not a target: one broker send per effect plus 3 store round trips in the client; "
        f"{one['trips']:.2f} round trips an effect)"
    )
    print(
        f"claim latency at a steady {args.paced_rate:.0f} effects/s ({paced[2]} effects, workers not saturated): "
        f"p50 {fmt_ms(paced[0])} ms, p99 {fmt_ms(paced[1])} ms"
    )
    print(verdict("outbox claim latency p99 ms (steady load)", paced[1] * 1000, 100, higher_is_better=False))
    print(verdict("store round trips per effect (enqueue_many)", many["trips"], 4, higher_is_better=False))


def print_rich_table(headers: list[str], rows: list[list[Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in headers:
        table.add_column(h, justify="left" if h == "variant" else "right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 effects over 20 keys")
    parser.add_argument("--effects", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--enqueuers", type=int, default=4, help="client threads enqueueing (disjoint keys)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--paced", type=int, default=1000, help="effects of the steady-load latency phase")
    parser.add_argument("--sites", action="store_true", help="attribute the round trips to their call sites")
    parser.add_argument("--paced-rate", type=float, default=100.0, help="their enqueue rate per second")
    args = parser.parse_args()
    if args.quick:
        args.effects, args.keys, args.paced = 1_000, 20, 300
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(args)


if __name__ == "__main__":
    main()
