"""Shared helpers of the benchmarks: worker subprocesses, temp dirs, statistics, tables.

The benches run real ``celery worker`` processes the way an operator would (the same harness
as ``tests/plugins/workers.py``): a subprocess started in its own session, awaited through a
ready file written on Celery's ``worker_ready`` signal, stopped with SIGTERM and, if it does not
go, SIGKILL to its whole process group. Everything a bench creates lives in one temp dir that is
removed on exit; Redis keys are confined to a dedicated database and a per-run queue name.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

__all__ = [
    "BENCH_DIR",
    "POSTGRES_URL",
    "REDIS_DB",
    "REDIS_URL",
    "BenchEnv",
    "Worker",
    "bench_env",
    "cleanup_redis",
    "drop_postgres_schema",
    "exit_on_sigterm",
    "fmt_ms",
    "machine",
    "mean",
    "percentile",
    "postgres_url",
    "print_table",
    "start_worker",
    "verdict",
    "wait_all",
    "wait_until",
]

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: a Redis database used by nothing else (the tests use 15)
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "11"))
REDIS_URL = os.environ.get("BENCH_REDIS_URL", f"redis://127.0.0.1:6379/{REDIS_DB}")
#: the PostgreSQL the ``--store postgres`` runs use: a fresh schema in it per run, dropped at the end
POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: ``--broker rabbitmq``: the workers' broker (the result backend stays Redis)
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
BROKERS = {"redis": ("Redis", REDIS_URL), "rabbitmq": ("RabbitMQ", RABBITMQ_URL)}


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.02, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class BenchEnv:
    """One bench run: a temp dir (SQLite file, worker logs), a unique queue, the env for workers."""

    tmp: Path
    queue: str
    store_url: str
    env: dict[str, str] = field(default_factory=dict)

    def apply_to_process(self) -> None:
        """Make this (client) process see the same configuration as the workers."""
        os.environ.update(self.env)


def postgres_url(schema: str, base: str = POSTGRES_URL) -> str:
    """``base`` with ``schema=`` added (our store creates the schema on first use)."""
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def drop_postgres_schema(schema: str, base: str = POSTGRES_URL) -> None:
    """Drop a schema a bench created (``DROP SCHEMA … CASCADE``); never raises."""
    try:
        import psycopg

        with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except Exception as exc:  # noqa: BLE001 - cleanup: report, do not mask the bench's own error
        print(f"could not drop PostgreSQL schema {schema}: {exc}", file=sys.stderr)


@contextmanager
def bench_env(prefix: str, store: str = "sqlite", broker: str = "redis") -> Iterator[BenchEnv]:
    """``store``: ``sqlite`` (a file in the temp dir) or ``postgres`` (a fresh schema in
    ``$BENCH_POSTGRES_URL``, dropped on exit); ``broker``: ``redis`` or ``rabbitmq``."""
    if store not in ("sqlite", "postgres"):
        raise SystemExit(f"unknown store {store!r} (sqlite, postgres)")
    if broker not in BROKERS:
        raise SystemExit(f"unknown broker {broker!r} ({', '.join(BROKERS)})")
    tmp = Path(tempfile.mkdtemp(prefix=f"celery-durable-{prefix}-"))
    queue = f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
    schema = f"bench_{prefix}_{uuid.uuid4().hex[:8]}" if store == "postgres" else None
    store_url = f"sqlite:///{tmp / 'durable.db'}" if schema is None else postgres_url(schema)
    env = {
        "BENCH_BROKER_URL": BROKERS[broker][1],
        "BENCH_RESULT_URL": REDIS_URL,
        "BENCH_QUEUE": queue,
        "DURABLE_STORE_URL": store_url,
    }
    try:
        yield BenchEnv(tmp, queue, store_url, env)
    finally:
        cleanup_redis(queue)
        shutil.rmtree(tmp, ignore_errors=True)
        if schema is not None:
            drop_postgres_schema(schema)


def cleanup_redis(queue: str, result_ids: Sequence[str] = ()) -> None:
    """Delete this run's queue keys and the given result keys from the bench database."""
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a bench dependency
        return
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [k for k in client.scan_iter(match=f"*{queue}*", count=1000)]
        keys += [f"celery-task-meta-{rid}" for rid in result_ids]
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        # kombu's shared bindings (the workers' control mailbox): only once no other bench runs
        if not any(True for _ in client.scan_iter(match="*bench-*", count=1000)):
            shared = list(client.scan_iter(match="_kombu.binding*", count=1000))
            if shared:
                client.delete(*shared)
    finally:
        client.close()


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log_path: Path
    name: str

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group (warm shutdown), then SIGKILL it if it lingers."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # pool children may outlive their parent: kill whatever is left of the group
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)


def start_worker(
    env: BenchEnv,
    app: str = "apps.benchapp",
    concurrency: int = 2,
    pool: str = "prefork",
    loglevel: str = "WARNING",
    ready_timeout: float = 60.0,
    extra_env: dict[str, str] | None = None,
    queues: str | None = None,
) -> Worker:
    """Start ``celery -A <app> worker`` with cwd in the temp dir and ``bench/`` on PYTHONPATH
    (``extra_env`` added to its environment, ``queues``: its ``-Q``)."""
    name = f"bench-{uuid.uuid4().hex[:6]}"
    ready = env.tmp / f"{name}.ready"
    log_path = env.tmp / f"{name}.log"
    pythonpath = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
    full_env = (
        dict(os.environ) | env.env | (extra_env or {}) | {"BENCH_READY_FILE": str(ready), "PYTHONPATH": pythonpath}
    )
    cmd = [
        sys.executable, "-m", "celery", "-A", app, "worker", "-P", pool, "-c", str(concurrency),
        "-n", f"{name}@%h", f"--loglevel={loglevel}", "--without-gossip", "--without-mingle",
        "--without-heartbeat", *(["-Q", queues] if queues else []),
    ]  # fmt: skip
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=env.tmp, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    worker = Worker(proc, log_path, name)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}:\n{worker.log_tail()}")
        return ready.exists()

    try:
        wait_until(up, timeout=ready_timeout, what=f"worker {name} to be ready")
    except BaseException:
        worker.stop()
        raise
    return worker


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` so ``finally`` blocks stop the workers and remove temp dirs."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


# --- statistics and output ----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def machine() -> str:
    """Cores and load average: the figures are only comparable on a quiet machine."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None, stream: TextIO | None = None
) -> None:
    """A rich table (the ``durable`` CLI's rendering): first column left-aligned, the others right."""
    from celery_durable.cli.render import print_table as render

    if title:
        print(f"\n{title}", file=stream or sys.stdout)
    render(headers, rows, right=range(1, len(headers)), stream=stream)


def verdict(label: str, value: float, target: float, higher_is_better: bool, goal: float | None = None) -> str:
    ok = value >= target if higher_is_better else value <= target
    cmp = ">=" if higher_is_better else "<="
    extra = ""
    if goal is not None:
        met = value >= goal if higher_is_better else value <= goal
        extra = f", goal {cmp} {goal:g}: {'met' if met else 'not met'}"
    return f"{label} = {value:.2f} (target {cmp} {target:g}{extra}) -> {'PASS' if ok else 'MISS'}"


def wait_all(
    read_status: Callable[[str], str | None], ids: Sequence[str], timeout: float, interval: float = 0.01
) -> None:
    """Wait for every id to reach a terminal status, in start order.

    One point read every ``interval`` on the oldest unfinished id, then straight on to the next:
    executions finish roughly in start order, so this costs about ``len(ids)`` + elapsed/interval
    reads, instead of a read of every pending id per round (which would take a core from the
    workers on a 2-core machine).
    """
    deadline = time.monotonic() + timeout
    for i, eid in enumerate(ids):
        while read_status(eid) not in ("completed", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(ids) - i} executions still running after {timeout}s")
            time.sleep(interval)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds: user + system) of a live process, from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU time used so far (user + system, from /proc) by the process tree of ``root_pid`` (a
    worker and its pool children: ``workers``), this process (the client: ``client``) and every
    PostgreSQL server process (``db``). Take one before and one after, and subtract: a process
    that exited in between takes its time with it."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None:
                stats[int(entry.name)] = found
    tree, frontier = set(), {root_pid}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, (_, ppid, _) in stats.items() if ppid in frontier and pid not in tree}
    own = os.times()
    return {
        "workers": sum(stats[pid][2] for pid in tree if pid in stats),
        "client": own.user + own.system,
        "db": sum(cpu for name, _, cpu in stats.values() if name == "postgres"),
    }
