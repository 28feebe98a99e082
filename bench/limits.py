"""Keyed concurrency limits: 1,000 activities over 20 keys with ``max_running=2``, against the
same activities without a limit, in one run on the same worker.

The bench process is the client: it starts ``--workflows`` workflows at once, each fanning out
(``wf.gather``) its share of the activities over all ``--keys`` keys (runs of 2-3 consecutive
activities per key, each workflow starting at a key of its own, so deliveries of one key arrive
together and contend), and waits for all by polling their exec documents (in start order, every
10 ms, through the uncounted store). Each activity sleeps ``--ms`` (a small fixed amount of work,
so concurrency matters) and records, from its own body, its key, start and end (``time.time()``),
pid, execution, step and attempt. One ``celery worker`` (``-P prefork -c 8`` by default: with the
benches' usual ``-c 2`` no key could ever run 3 at once, and the limit would not be tested), Redis
broker, the SQLite store file (``--store postgres``: a fresh PostgreSQL schema), library defaults
otherwise (``apps/limitsapp.py``). No beat runs: a waiting step is started only by the hand-off
of a freed slot.

Variants, on the same worker, interleaved after a warm-up of each:

- ``no limit``: ``limits.free`` activities (eager activities apply: the library's default);
- ``Limit(max_running=2, key=…)``: ``limits.limited``, the same body (a limited step is never run
  eagerly: each is a message, taking a slot before its lease or queued on the limit's document);
- ``no limit, eager activities off`` (``--no-delivered`` skips it): the unlimited activities on a
  second worker (same options, its own queue, ``durable_eager_activities = 0``), every activity a
  message as a limited one is: it tells the limit's own store calls from the eager run's savings.
  Not what a target is judged on (the targets compare with the defaults, ``no limit``).

Measured, per the issue's targets:

- max concurrency per key: the largest number of activity bodies of one key overlapping in time
  (sweep over their start/end), limited run; the unlimited run's figure shows the contention;
- throughput: activities/s (first start -> all results seen by the caller), limited/unlimited;
- store calls added per activity: round trips of the client and every pool process (a
  ``CountingStore`` in each; the caller's status polling excluded), (limited - unlimited) / N;
- slot freed -> next start of that key: for each step the engine queued on its limit
  (``limit_waiting``), its body's start minus the latest body end of that key before it (the
  slot is freed after that end: the outcome's commit, the slot's write and the waiter's message
  are inside this gap).

    python bench/limits.py                    # 1,000 activities (20 workflows x 50), 20 keys
    python bench/limits.py --activities 200   # a smaller run
    python bench/limits.py --store postgres   # on PostgreSQL (a fresh schema)
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from _common import (
    BenchEnv,
    Worker,
    bench_env,
    exit_on_sigterm,
    fmt_ms,
    machine,
    mean,
    percentile,
    print_table,
    start_worker,
    verdict,
    wait_all,
)

STORES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
FREE = "no limit"
LIMITED = "Limit(max_running=2, key=...)"
DELIVERED = "no limit, eager activities off"
DELIVERED_SUFFIX = "-delivered"


class Client:
    """The bench process's side: starts the fan-out workflows, waits, reads what the workers wrote."""

    def __init__(self, env: BenchEnv, out: Path, args: argparse.Namespace) -> None:
        from apps import benchapp, limitsapp

        self.app = limitsapp
        self.bench = benchapp
        self.env = env
        self.out = out
        self.args = args
        self.poll = limitsapp.COUNTING.inner  # status polls are not counted

    def _status(self, eid: str) -> str | None:
        ex = self.poll.read(eid, "exec")
        return None if ex is None else str(ex.get("status"))

    def counts(self) -> Counter[str]:
        """Round trips so far: every process's (workers from their files, this one in memory)."""
        total: Counter[str] = Counter(dict(self.app.COUNTING.counts))
        for f in self.out.glob("*.counts.json"):
            try:
                total.update(json.loads(f.read_text())["counts"])
            except (OSError, ValueError):
                continue
        return total

    def events(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for f in self.out.glob("*.counts.json"):
            try:
                total.update(json.loads(f.read_text())["events"])
            except (OSError, ValueError):
                continue
        return total

    def quiet(self) -> None:
        """Let the workers' flush threads write what they did (they write every 0.2 s)."""
        time.sleep(1.0)

    def run(self, variant: str, workflows: int, per: int) -> dict[str, Any]:
        fan = self.app.fan_limited if variant == LIMITED else self.app.fan_free
        keys, ms = self.args.keys, self.args.ms
        self.quiet()
        before = self.counts()
        # every message of the eager-off runs goes to the second worker's queue
        self.bench.ROUTE_TO = self.env.queue + DELIVERED_SUFFIX if variant == DELIVERED else None
        try:
            t0 = time.perf_counter()
            ids = [fan.start(w, per, keys, ms).id for w in range(workflows)]
            try:
                wait_all(self._status, ids, timeout=self.args.timeout)
            except TimeoutError as exc:
                raise RuntimeError(f"{variant}: {exc}\n{self.stuck()}") from exc
            elapsed = time.perf_counter() - t0
        finally:
            self.bench.ROUTE_TO = None
        expect = per * (per - 1) // 2
        for eid in ids:
            ex = self.poll.read(eid, "exec")
            assert ex is not None and ex["status"] == "completed" and ex["result"] == expect, ex
        self.quiet()
        after = self.counts()
        calls = after - before
        return {"variant": variant, "ids": ids, "n": workflows * per, "wall": elapsed, "calls": calls}

    def stuck(self) -> str:
        """What the limit documents hold (a run that timed out)."""
        from celery_durable.engine.limits.slots import LIMIT_DOC_ID
        from celery_durable.engine.limits.spec import limit_pk

        lines = []
        for k in range(self.args.keys):
            key = f"k{k:02d}"
            doc = self.poll.read(limit_pk({"name": "bench-limit", "key": key}), LIMIT_DOC_ID) or {}
            lines.append(
                f"  {key}: holders {len(doc.get('holders') or {})}, waiters {len(doc.get('waiters') or [])}, "
                f"due {doc.get('due_kind')} {doc.get('due_at')}"
            )
        return "limit documents:\n" + "\n".join(lines)

    def read_jsonl(self, name: str) -> list[list[Any]]:
        rows = []
        for f in self.out.glob(f"*.{name}.jsonl"):
            rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return rows


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at once (an end at the same instant as a start closes first)."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def analyse(rows: list[list[Any]], waited: set[tuple[str, int]], ids: set[str]) -> dict[str, Any]:
    """``rows``: the spans of one run (its executions ``ids``)."""
    by_key: dict[str, list[tuple[float, float, str, int]]] = defaultdict(list)
    steps: Counter[tuple[str, int]] = Counter()
    for _, key, t0, t1, _pid, eid, step, _attempt in rows:
        if eid in ids:
            by_key[key].append((t0, t1, eid, step))
            steps[(eid, step)] += 1
    per_key = {k: max_overlap([(s, e) for s, e, _, _ in v]) for k, v in by_key.items()}
    gaps = []
    for spans in by_key.values():
        ends = sorted(e for _, e, _, _ in spans)
        for s, _e, eid, step in spans:
            if (eid, step) not in waited:
                continue
            prev = [e for e in ends if e <= s]
            if prev:
                gaps.append(s - prev[-1])
    return {
        "spans": sum(len(v) for v in by_key.values()),
        "reruns": sum(c - 1 for c in steps.values()),
        "max_per_key": max(per_key.values(), default=0),
        "keys_at_max": sum(1 for v in per_key.values() if v == max(per_key.values(), default=0)),
        "gaps": gaps,
        "waited": sum(1 for s in steps if s in waited),
    }


def worker_problems(worker: Worker) -> list[str]:
    text = worker.log_path.read_text(errors="replace") if worker.log_path.exists() else ""
    return [line for line in text.splitlines() if re.search(r"ERROR|CRITICAL|Traceback|WARNING|Error", line)]


def measure(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    load_start = machine()
    print(f"{load_start} at the start", flush=True)
    per = args.activities // args.workflows
    n = per * args.workflows
    with bench_env("limits", store=args.store) as env:
        out = env.tmp / "limits-out"
        out.mkdir()
        env.env["BENCH_LIMITS_DIR"] = str(out)
        env.env["BENCH_LIMIT_MAX"] = "2"
        env.apply_to_process()
        worker = start_worker(env, app="apps.limitsapp", concurrency=args.concurrency, pool=args.pool)
        variants = [FREE, LIMITED]
        workers = [worker]
        if not args.no_delivered:
            delivered_queue = env.queue + DELIVERED_SUFFIX
            workers.append(
                start_worker(
                    env,
                    app="apps.limitsapp",
                    concurrency=args.concurrency,
                    pool=args.pool,
                    extra_env={"BENCH_EAGER_ACTIVITIES": "0", "BENCH_ROUTE_QUEUE": delivered_queue},
                    queues=delivered_queue,
                )
            )
            variants.append(DELIVERED)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        try:
            client = Client(env, out, args)
            for variant in variants:  # warm-up: imports, connections, the limit documents
                client.run(variant, 2, min(per, 20))
            for _ in range(args.rounds):
                for variant in variants:
                    runs[variant].append(client.run(variant, args.workflows, per))
                    print(f"  {variant}: {runs[variant][-1]['wall']:.2f} s", flush=True)
            spans = client.read_jsonl("spans")
            waited_rows = client.read_jsonl("waited")
            waited = {(str(e), int(s)) for e, s, _ in waited_rows}
            events = client.events()
        finally:
            problems = []
            for w in workers:
                w.stop()
                problems += worker_problems(w)
            client_app = getattr(locals().get("client"), "app", None)
            if client_app is not None:
                client_app.durable.shutdown()
    load_end = machine()
    if args.dump:
        ids_of = {v: [eid for r in rs for eid in r["ids"]] for v, rs in runs.items()}
        Path(args.dump).write_text(json.dumps({"spans": spans, "waited": waited_rows, "ids": ids_of}))

    results = {}
    for variant, rs in runs.items():
        kind = "limited" if variant == LIMITED else "free"  # the delivered runs: told apart by their ids
        rows = [r for r in spans if r[0] == kind]
        ids = {eid for r in rs for eid in r["ids"]}
        results[variant] = analyse(rows, waited, ids)

    print(
        f"\nlimits: {n} activities ({args.workflows} workflows fanning out {per} each over {args.keys} keys, "
        f"each activity sleeping {args.ms:g} ms), {args.rounds} round(s) after a warm-up; 1 worker "
        f"-P {args.pool} -c {args.concurrency}, Redis broker, {STORES[args.store]} store, no beat"
    )
    free_rate = max(n / r["wall"] for r in runs[FREE])
    rows_t = []
    for variant, rs in runs.items():
        rates = [n / r["wall"] for r in rs]
        a = results[variant]
        rows_t.append(
            [
                variant,
                len(rs),
                f"{min(r['wall'] for r in rs):.2f}",
                f"{max(rates):.1f}",
                f"{mean(rates):.1f}",
                f"{max(rates) / free_rate:.2f}",
                a["max_per_key"],
                a["spans"],
                a["reruns"],
            ]
        )
    print_table(
        [
            "variant",
            "rounds",
            "best wall s",
            "best act/s",
            "mean act/s",
            "this/no limit",
            "max per key",
            "bodies",
            "re-runs",
        ],
        rows_t,
        title="Throughput and concurrency per key (first start -> all results seen by the caller; from the bodies)",
    )

    ops = sorted({op for rs in runs.values() for r in rs for op in r["calls"]})
    per_act = {v: {op: mean([r["calls"][op] / r["n"] for r in rs]) for op in ops} for v, rs in runs.items()}
    totals = {v: mean([sum(r["calls"].values()) / r["n"] for r in rs]) for v, rs in runs.items()}
    headers = ["store call", FREE, LIMITED, f"added (vs {FREE})"]
    if DELIVERED in runs:
        headers += [DELIVERED, f"added (vs {DELIVERED})"]
    rows_c = []
    for op, table in [(op, {v: per_act[v][op] for v in runs}) for op in ops] + [("total", totals)]:
        row = [op, f"{table[FREE]:.2f}", f"{table[LIMITED]:.2f}", f"{table[LIMITED] - table[FREE]:+.2f}"]
        if DELIVERED in runs:
            row += [f"{table[DELIVERED]:.2f}", f"{table[LIMITED] - table[DELIVERED]:+.2f}"]
        rows_c.append(row)
    print_table(
        headers,
        rows_c,
        title="Store round trips per activity (client + every pool process; the caller's status polls excluded)",
    )

    gaps = results[LIMITED]["gaps"]
    rows_g = [
        [
            "slot freed -> next start of the key",
            len(gaps),
            fmt_ms(percentile(gaps, 50)),
            fmt_ms(percentile(gaps, 90)),
            fmt_ms(percentile(gaps, 99)),
            fmt_ms(max(gaps, default=float("nan"))),
        ]
    ]
    print_table(
        ["limited run", "waits", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        rows_g,
        title="From the previous body end of a key to the start of a step that waited on its limit",
    )
    print(f"limit events (all runs, warm-up included): {dict(sorted(events.items()))}")
    print(f"steps that waited on their limit (measured runs): {results[LIMITED]['waited']} of {n * args.rounds}")
    if problems:
        print(f"worker log: {len(problems)} warning/error line(s), the first 20:")
        for line in problems[:20]:
            print(f"  {line[:300]}")
    else:
        print("worker log: no warnings or errors")
    print(f"run time {time.perf_counter() - t_start:.1f} s; {load_start} at the start, {load_end} at the end")

    limited_rate = max(n / r["wall"] for r in runs[LIMITED])
    seen = results[LIMITED]["spans"]
    if seen != n * args.rounds:  # the bodies' records are what the first and last targets are judged on
        print(f"DATA MISMATCH: {seen} activity bodies recorded, {n * args.rounds} activities run (limited)")
    print(
        verdict(
            "max concurrency per key observed, limited (max_running=2)",
            results[LIMITED]["max_per_key"] if seen == n * args.rounds else float("inf"),
            2,
            False,
        )
    )
    print(verdict("throughput ratio limited/no limit (best round)", limited_rate / free_rate, 0.8, True))
    print(verdict("store calls added per activity", totals[LIMITED] - totals[FREE], 1.0, False))
    print(verdict("slot freed -> next start of the key, p99 ms", percentile(gaps, 99) * 1000, 50.0, False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--activities", type=int, default=1000, help="activities per variant and round (default 1000)")
    parser.add_argument("--workflows", type=int, default=20, help="workflows they fan out from (default 20)")
    parser.add_argument("--keys", type=int, default=20, help="limit keys (default 20)")
    parser.add_argument("--ms", type=float, default=30.0, help="each activity's work: a sleep (default 30 ms)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--concurrency", type=int, default=8, help="worker concurrency (default 8)")
    parser.add_argument("--pool", default="prefork", help="worker pool (default prefork)")
    parser.add_argument("--store", default="sqlite", choices=sorted(STORES), help="the store (default sqlite)")
    parser.add_argument(
        "--no-delivered",
        action="store_true",
        help=f"skip the {DELIVERED!r} variant (a second worker, eager activities off: for the store calls)",
    )
    parser.add_argument("--dump", help="write the bodies' spans, the waits and the runs' ids to this JSON file")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take (default 120)")
    args = parser.parse_args()
    if args.activities < args.workflows:
        raise SystemExit("--activities must be at least --workflows")
    exit_on_sigterm()
    measure(args)


if __name__ == "__main__":
    main()
