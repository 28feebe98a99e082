"""``python -m example_project``: start workers and beat, fulfil a few orders durably, print a summary.

Needs no server by default: workflow state goes to a SQLite file and Celery messages to a
``filesystem://`` broker, both in a fresh run directory. Set ``EXAMPLE_BROKER_URL`` and
``DURABLE_STORE_URL`` to use Redis and Cosmos instead (see README.md). One order waits for its
release date on a durable timer that beat fires; during another one a worker is killed
(SIGKILL) and recovery finishes the order on another worker. ``--ui`` keeps running afterwards
with the web timeline, Flower and the workers' Prometheus metrics. Exit status: 0 when every
order ended as its scenario predicts, 1 otherwise, 130 on Ctrl-C (``--ui``: 0 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_durable import ExecutionInfo, WorkflowHandle
    from example_project.models import Order, Shipment

PACKAGE_PARENT = Path(__file__).resolve().parent.parent
#: app.STACK_DUMP_SIGNAL (not imported: the app is imported only once the environment is set)
STACK_DUMP_SIGNAL = signal.SIGUSR2


# --- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    card_token: str
    address: str
    #: returns what is wrong with the outcome, or None when it is what the scenario predicts
    check: Callable[[Shipment], str | None]
    #: a pre-order released this many seconds after it is placed (a durable timer fired by beat)
    release_in: float = 0.0
    #: the worker packing this order is killed (SIGKILL) once the other orders ended
    crash: bool = False


def _expect(
    status: str, attempts: int | None = None, error: str | None = None, undone: Sequence[str] = ()
) -> Callable[[Shipment], str | None]:
    def check(s: Shipment) -> str | None:
        if s.status != status:
            return f"expected {status}, got {s.status}"
        if attempts is not None and (s.receipt is None or s.receipt.attempts != attempts):
            return f"expected the charge to take {attempts} attempt(s), got {s.receipt}"
        if error is not None and error not in (s.reason or ""):
            return f"expected {error} in the reason, got {s.reason!r}"
        got = [c.split()[0] for c in s.compensations]
        if got != list(undone):
            return f"expected compensations {list(undone)}, got {s.compensations}"
        return None

    return check


SCENARIOS = [
    Scenario("standard", "tok_visa", "1 Main St, Springfield", _expect("shipped", attempts=1)),
    Scenario("flaky-gateway", "tok_flaky", "2 Elm St, Springfield", _expect("shipped", attempts=2)),
    Scenario(
        "gateway-down",
        "tok_gateway_down",
        "3 Oak St, Springfield",
        _expect("cancelled", error="PaymentGatewayError", undone=["released"]),
    ),
    Scenario(
        "card-declined",
        "tok_declined",
        "4 Pine St, Springfield",
        _expect("cancelled", error="CardDeclined", undone=["released"]),
    ),
    Scenario(
        "bad-address",
        "tok_visa",
        "Nowhere Island",
        _expect("cancelled", error="AddressRejected", undone=["refunded", "released"]),
    ),
    Scenario("pre-order", "tok_visa", "6 Birch St, Springfield", _expect("shipped", attempts=1), release_in=3.0),
    Scenario("worker-crash", "tok_visa", "7 Cedar St, Springfield", _expect("shipped", attempts=1), crash=True),
]

CATALOGUE = [("MUG-01", "12.50"), ("TEE-M", "19.99"), ("CAP-02", "15.00"), ("BAG-07", "34.90")]


def make_order(i: int, scenario: Scenario) -> Order:
    from example_project.models import LineItem, Order

    n_items = 2 + i % 3
    items = [
        LineItem(sku=sku, qty=1 + (i + k) % 2, unit_price=Decimal(price))
        for k, (sku, price) in enumerate(CATALOGUE[:n_items])
    ]
    now = datetime.now(tz=UTC)
    return Order(
        id=f"SO-{1001 + i}",
        customer_email=f"customer{i + 1}@example.com",
        card_token=scenario.card_token,
        address=scenario.address,
        items=items,
        placed_at=now,
        release_at=now + timedelta(seconds=scenario.release_in) if scenario.release_in else None,
    )


# --- workers, beat and the UIs: subprocesses -------------------------------------------------


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path
    #: killed on purpose (the crash scenario): its exit status is no failure
    killed: bool = False
    #: did not stop on SIGTERM: its log ends with the stacks of its processes, printed whole
    stuck: bool = False
    metrics_port: int | None = None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _spawn(name: str, args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> WorkerProc:
    """``celery -A example_project.app <args>`` in its own session (Ctrl-C reaches us only; we
    stop it ourselves), its output in ``run_dir/<name>.log``."""
    full_env = dict(os.environ) | (env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), full_env.get("PYTHONPATH")]))
    ready, log = run_dir / f"{name}.ready", run_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project.app", *args],
            cwd=run_dir,
            env=full_env | {"EXAMPLE_READY_FILE": str(ready)},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return WorkerProc(name, proc, log, ready)


@dataclass
class Fleet:
    """The workers and beat of one run."""

    run_dir: Path
    queue: str
    tag: str
    concurrency: int
    events: bool = False
    #: first port of the workers' Prometheus metrics (--ui), one port per worker
    metrics_from: int | None = None
    workers: list[WorkerProc] = field(default_factory=list)
    others: list[WorkerProc] = field(default_factory=list)

    def start_worker(self) -> WorkerProc:
        name = f"worker{len(self.workers) + 1}"
        args = [
            "worker",
            "-P",
            "prefork",
            "-c",
            str(self.concurrency),
            "-Q",
            self.queue,
            "-n",
            f"{name}@example-{self.tag}",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
        ] + (["-E"] if self.events else [])
        env = {}
        port = None if self.metrics_from is None else self.metrics_from + len(self.workers)
        if port is not None:
            env["EXAMPLE_METRICS_PORT"] = str(port)
        worker = _spawn(name, args, self.run_dir, env)
        worker.metrics_port = port
        self.workers.append(worker)
        return worker

    def start_beat(self) -> WorkerProc:
        """``celery beat``: fires due timers, re-sends what crashed workers lost (durable_install_beat)."""
        beat = _spawn("beat", ["beat", "-s", str(self.run_dir / "beat-schedule"), "--loglevel=INFO"], self.run_dir)
        self.others.append(beat)
        return beat

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.proc.poll() is None]

    def kill(self, worker: WorkerProc) -> None:
        """SIGKILL the worker's main process and its pool children: no warm shutdown, no lease given back."""
        worker.killed = True
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()


def wait_ready(workers: list[WorkerProc], timeout: float) -> None:
    """Wait for every worker's ``worker_ready`` file; raise if one exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not all(w.ready.exists() for w in workers):
        for w in workers:
            if w.proc.poll() is not None:
                raise RuntimeError(f"{w.name} exited with {w.proc.returncode}:\n{w.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {timeout:.0f}s:\n" + "\n".join(w.tail(10) for w in workers))
        time.sleep(0.05)


def wait_logged(proc: WorkerProc, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.tail(200):
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not started after {timeout:.0f}s:\n{proc.tail(10)}")
        time.sleep(0.05)


def stop_workers(workers: list[WorkerProc], timeout: float = 30.0) -> list[str]:
    """SIGTERM (Celery's warm shutdown), then SIGKILL the process group on timeout.

    A warm shutdown waits for the running tasks, and then each pool child gives its leases back:
    one store call may take up to its deadline (Cosmos: 10 s) before it fails, so the grace is
    30 s (Kubernetes' default), not less; a stop usually takes 2-3 s."""
    problems = []
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            problems.append(f"{w.name} ignored SIGTERM for {timeout:.0f}s: killed (its stacks are in {w.log})")
            # not reaped yet, so the group id is still ours: the main process and its pool children
            # first write where each of their threads stands (app.STACK_DUMP_SIGNAL), then die
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, STACK_DUMP_SIGNAL)
            time.sleep(1.0)
            w.stuck = True
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
            continue
        if w.proc.returncode not in (0, -signal.SIGTERM) and not w.killed:
            problems.append(f"{w.name} exited with {w.proc.returncode}")
    return problems


# --- reporting ------------------------------------------------------------------------------


def describe(s: Shipment) -> str:
    """One line for the summary table."""
    if s.failure is None:
        assert s.receipt is not None
        packers = "+".join(sorted({p.packed_by for p in s.parcels}))
        return (
            f"{s.tracking_number}, {len(s.parcels)} parcels ({packers}), "
            f"{s.receipt.amount} {s.receipt.currency} charged in {s.receipt.attempts} attempt(s)"
        )
    f = s.failure
    undone = ", ".join(c.split()[0] for c in s.compensations) or "nothing"
    return f"{f.step}: {f.error_type} after {f.attempts} attempt(s); undone: {undone}"


def table(rows: list[list[str]]) -> str:
    """The summary as a rich table (the ``celery durable`` CLI's rendering): header row first."""
    from celery_durable.cli.render import print_table  # imported late, like the app: after the env is set

    out = io.StringIO()
    print_table(rows[0], rows[1:], right=[4, 5], stream=out)  # steps, elapsed
    return out.getvalue().rstrip("\n")


@dataclass
class Tracked:
    order: Order
    scenario: Scenario
    handle: WorkflowHandle[Shipment]
    seen: tuple[str, int, str | None] = ("", -1, None)
    info: ExecutionInfo | None = field(default=None)


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m example_project", description=__doc__.split("\n\n")[0])
    p.add_argument("--orders", type=int, default=len(SCENARIOS), help="orders to place (scenarios cycle)")
    p.add_argument("--workers", type=int, default=2, help="celery worker processes to start")
    p.add_argument("--concurrency", type=int, default=2, help="prefork pool size of each worker")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=os.environ.get("EXAMPLE_RUN_DIR") or None,
        help="directory for the store, broker folders and logs, kept (default: $EXAMPLE_RUN_DIR, else a fresh "
        "temporary directory removed at exit)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all orders")
    p.add_argument(
        "--ui",
        action="store_true",
        help="then keep running with the web timeline, Flower and the workers' metrics until Ctrl-C",
    )
    p.add_argument("--ui-port", type=int, default=8765, help="port of the web timeline (--ui)")
    p.add_argument("--flower-port", type=int, default=5555, help="port of Flower (--ui)")
    p.add_argument("--metrics-port", type=int, default=9100, help="first worker's Prometheus port (--ui)")
    args = p.parse_args(argv)
    if args.orders < 1 or args.workers < 1 or args.concurrency < 1:
        p.error("--orders, --workers and --concurrency must be >= 1")
    for name in ("ui_port", "flower_port", "metrics_port"):
        if not 0 < getattr(args, name) < 65536:
            p.error(f"--{name.replace('_', '-')} must be a TCP port (1-65535)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    temporary = args.run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="celery-durable-example-")) if temporary else args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # app.py reads these at import: set them first, so the client and its workers agree
    os.environ["EXAMPLE_RUN_DIR"] = str(run_dir)
    broker = os.environ.get("EXAMPLE_BROKER_URL") or "filesystem://"
    if not broker.startswith("filesystem:"):
        # a shared broker may hold messages of earlier runs: use a queue of our own
        os.environ.setdefault("EXAMPLE_QUEUE", f"example-{tag}")

    from example_project.app import QUEUE, STORE_URL, app, durable

    print(f"celery_durable example: {args.orders} order(s), {args.workers} worker(s) x {args.concurrency} processes")
    where = f"folders in {run_dir / 'broker'}" if broker.startswith("filesystem:") else f"queue {QUEUE}"
    print(f"  broker   {broker}  ({where})")
    print(f"  store    {STORE_URL.split('?')[0]}")
    print(f"  run dir  {run_dir}" + ("  (removed at exit; --keep keeps it)" if temporary and not args.keep else ""))

    metrics = args.ui and importlib.util.find_spec("prometheus_client") is not None
    metrics_from = args.metrics_port if metrics else None
    fleet = Fleet(run_dir, QUEUE, tag, args.concurrency, events=args.ui, metrics_from=metrics_from)
    ui_procs: list[WorkerProc] = []
    failures: list[str] = []
    interrupted = False
    try:
        workers = [fleet.start_worker() for _ in range(args.workers)]
        beat = fleet.start_beat()
        wait_ready(workers, timeout=60.0)
        wait_logged(beat, "beat: Starting", timeout=30.0)
        print(f"workers and beat ready after {time.monotonic() - t0:.1f}s\n")
        failures += run_orders(args, tag, fleet)
        if args.ui and not failures:
            ui_procs = start_uis(args, run_dir, fleet)
            print("\nrunning until Ctrl-C", flush=True)
            while True:
                time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = not ui_procs  # --ui ends with Ctrl-C: that is no interruption
        print("\nstopping the workers" + (" and the UIs" if ui_procs else ""), flush=True)
    except Exception as exc:
        traceback.print_exc()
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        stop_workers(ui_procs)
        failures += stop_workers(fleet.workers + fleet.others)
        if QUEUE == f"example-{tag}":  # our own queue on a shared broker: leave nothing behind
            with app.connection_for_write() as conn:
                queue = app.amqp.queues[QUEUE].bind(conn.default_channel)
                queue.declare()  # kombu deletes only bindings this channel knows
                queue.delete()
        durable.shutdown()
        durable.store.close()

    if failures and not interrupted:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        for w in fleet.workers + fleet.others:
            print(f"\n--- last lines of {w.log} ---\n{w.tail(400 if w.stuck else 30)}", file=sys.stderr)
    ok = not failures and not interrupted
    verdict = "all outcomes as expected" if ok else "interrupted" if interrupted else "FAILED"
    print(f"\ndone in {time.monotonic() - t0:.1f}s: {verdict}")
    if temporary and not args.keep and ok:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif temporary:
        print(f"run directory kept: {run_dir}")
    return 130 if interrupted else 0 if ok else 1


def start_uis(args: argparse.Namespace, run_dir: Path, fleet: Fleet) -> list[WorkerProc]:
    """The web timeline (``celery durable ui``) and Flower, if installed; print where they are."""
    procs: list[WorkerProc] = []
    print()
    if importlib.util.find_spec("celery_durable.ui") is not None:
        ui = _spawn("ui", ["durable", "ui", "--port", str(args.ui_port)], run_dir)
        procs.append(ui)
        print(f"web timeline  http://127.0.0.1:{args.ui_port}/  (log: {ui.log}; the action token is printed there)")
    else:
        print("web timeline  not installed (this celery_durable has no celery_durable.ui)")
    if importlib.util.find_spec("flower") is not None:
        flower = _spawn("flower", ["flower", "--address=127.0.0.1", f"--port={args.flower_port}"], run_dir)
        procs.append(flower)
        print(f"Flower        http://127.0.0.1:{args.flower_port}/  (log: {flower.log})")
    else:
        print("Flower        not installed (pip install flower)")
    for w in fleet.alive():
        if w.metrics_port is not None:
            print(f"metrics       http://127.0.0.1:{w.metrics_port}/metrics  ({w.name}, Prometheus)")
    if fleet.metrics_from is None:
        print("metrics       not installed (pip install 'celery-durable[prometheus]')")
    time.sleep(1.0)  # a UI that cannot start (port taken, extra missing) says so at once
    for p in procs:
        if p.proc.poll() is not None:
            print(f"{p.name} exited with {p.proc.returncode}:\n{p.tail(5)}")
    return procs


def crash_worker(t: Tracked, fleet: Fleet, elapsed: float) -> None:
    """SIGKILL the worker that took ``t``'s crash request; start another if none is left."""
    taken = fleet.run_dir / "crash" / f"{t.order.id}.taken"
    name = taken.read_text().strip()
    victim = next(w for w in fleet.workers if w.name == name)
    fleet.kill(victim)
    print(
        f"{elapsed:6.2f}s  {t.order.id}  {victim.name} killed (SIGKILL) while packing: its lease lapses, "
        f"beat's recovery re-sends the step"
    )
    if not fleet.alive():
        spare = fleet.start_worker()
        print(f"{elapsed:6.2f}s  {t.order.id}  no worker left: {spare.name} started")


def run_orders(args: argparse.Namespace, tag: str, fleet: Fleet) -> list[str]:
    """Start the orders, print status changes until all end, then the summary; return failures."""
    from example_project.workflows import fulfil_order

    t0 = time.monotonic()
    tracked: list[Tracked] = []
    for i in range(args.orders):
        scenario = SCENARIOS[i % len(SCENARIOS)]
        order = make_order(i, scenario)
        if scenario.crash:  # read by pack_item (activities._crash_here)
            (fleet.run_dir / "crash").mkdir(exist_ok=True)
            (fleet.run_dir / "crash" / order.id).touch()
        # idempotent by id: starting the same id again joins the running execution
        handle = fulfil_order.options(workflow_id=f"{order.id}.{tag}").start(order)
        tracked.append(Tracked(order, scenario, handle))
        extra = f", released in {scenario.release_in:.0f}s (a timer beat fires)" if scenario.release_in else ""
        extra += ", its worker will be killed" if scenario.crash else ""
        print(
            f"{0.0:6.2f}s  {order.id}  started    {scenario.name}: {len(order.items)} item(s), "
            f"{order.total} {order.currency}, workflow id {handle.id}{extra}"
        )

    deadline = t0 + args.timeout
    pending = list(tracked)
    crashes = [t for t in tracked if t.scenario.crash]
    while pending:
        for t in list(pending):
            info = t.info = t.handle.poll()
            key = (info.status, info.steps, info.last_error)
            if key != t.seen:
                t.seen = key
                extra = f"  ({info.last_error})" if info.last_error else ""
                print(f"{time.monotonic() - t0:6.2f}s  {t.order.id}  {info.status:<9}  {info.steps} step(s){extra}")
            if info.done:
                pending.remove(t)
        # the crash waits for the other orders, so that it hits this order's step alone
        if crashes and all(t.scenario.crash for t in pending):
            for t in list(crashes):
                if (fleet.run_dir / "crash" / f"{t.order.id}.taken").exists():
                    crashes.remove(t)
                    crash_worker(t, fleet, time.monotonic() - t0)
        if pending and time.monotonic() > deadline:
            return [f"{t.order.id} still {t.seen[0]} after {args.timeout:.0f}s" for t in pending]
        time.sleep(0.05)

    failures: list[str] = []
    rows = [["order", "scenario", "status", "result", "steps", "elapsed"]]
    for t in tracked:
        assert t.info is not None
        elapsed = f"{t.info.updated_at - t.info.created_at:.2f}s"
        try:
            shipment = t.handle.result(timeout=5)
        except Exception as exc:  # the workflow itself failed: never expected here
            failures.append(f"{t.order.id} ({t.scenario.name}): {exc}")
            rows.append([t.order.id, t.scenario.name, t.info.status, f"ERROR {exc}", str(t.info.steps), elapsed])
            continue
        problem = t.scenario.check(shipment)
        if problem:
            failures.append(f"{t.order.id} ({t.scenario.name}): {problem}")
        status = str(shipment.status) + ("" if problem is None else " UNEXPECTED")
        rows.append([t.order.id, t.scenario.name, status, describe(shipment), str(t.info.steps), elapsed])
    print("\n" + table(rows))
    return failures


if __name__ == "__main__":
    sys.exit(main())
