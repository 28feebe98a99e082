"""``python -m example_project``: start workers, fulfil a few orders durably, print a summary.

Needs no server by default: workflow state goes to a SQLite file and Celery messages to a
``filesystem://`` broker, both in a fresh run directory. Set ``EXAMPLE_BROKER_URL`` and
``DURABLE_STORE_URL`` to use Redis and Cosmos instead (see README.md). Exit status: 0 when
every order ended as its scenario predicts, 1 otherwise, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
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
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_durable import ExecutionInfo, WorkflowHandle

    from .models import Order, Shipment

PACKAGE_PARENT = Path(__file__).resolve().parent.parent


# --- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    card_token: str
    address: str
    #: returns what is wrong with the outcome, or None when it is what the scenario predicts
    check: Callable[[Shipment], str | None]


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
        "gateway-down", "tok_gateway_down", "3 Oak St, Springfield",
        _expect("cancelled", error="PaymentGatewayError", undone=["released"]),
    ),
    Scenario(
        "card-declined", "tok_declined", "4 Pine St, Springfield",
        _expect("cancelled", error="CardDeclined", undone=["released"]),
    ),
    Scenario(
        "bad-address", "tok_visa", "Nowhere Island",
        _expect("cancelled", error="AddressRejected", undone=["refunded", "released"]),
    ),
]

CATALOGUE = [("MUG-01", "12.50"), ("TEE-M", "19.99"), ("CAP-02", "15.00"), ("BAG-07", "34.90")]


def make_order(i: int, scenario: Scenario) -> Order:
    from .models import LineItem, Order

    n_items = 2 + i % 3
    items = [
        LineItem(sku=sku, qty=1 + (i + k) % 2, unit_price=Decimal(price))
        for k, (sku, price) in enumerate(CATALOGUE[:n_items])
    ]
    return Order(
        id=f"SO-{1001 + i}",
        customer_email=f"customer{i + 1}@example.com",
        card_token=scenario.card_token,
        address=scenario.address,
        items=items,
        placed_at=datetime.now(tz=UTC),
    )


# --- workers --------------------------------------------------------------------------------


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start_workers(count: int, concurrency: int, run_dir: Path, queue: str, tag: str) -> list[WorkerProc]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    workers = []
    for i in range(count):
        name = f"worker{i + 1}"
        ready, log = run_dir / f"{name}.ready", run_dir / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", "example_project.app", "worker",
            "-P", "prefork", "-c", str(concurrency), "-Q", queue, "-n", f"{name}@example-{tag}",
            "--loglevel=INFO", "--without-gossip", "--without-mingle",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=run_dir, env=env | {"EXAMPLE_READY_FILE": str(ready)},
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us only; we stop the workers ourselves
            )
        workers.append(WorkerProc(name, proc, log, ready))
    return workers


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


def stop_workers(workers: list[WorkerProc], timeout: float = 15.0) -> list[str]:
    """SIGTERM (Celery's warm shutdown), then SIGKILL the process group on timeout."""
    problems = []
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            problems.append(f"{w.name} ignored SIGTERM for {timeout:.0f}s: killed")
            # not reaped yet, so the group id is still ours: the main process and its pool children
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
            continue
        if w.proc.returncode not in (0, -signal.SIGTERM):
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
    from celery_durable.cli_render import print_table  # imported late, like the app: after the env is set

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
        "--run-dir", type=Path, default=os.environ.get("EXAMPLE_RUN_DIR") or None,
        help="directory for the store, broker folders and logs, kept (default: $EXAMPLE_RUN_DIR, else a fresh "
        "temporary directory removed at exit)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all orders")
    args = p.parse_args(argv)
    if args.orders < 1 or args.workers < 1 or args.concurrency < 1:
        p.error("--orders, --workers and --concurrency must be >= 1")
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

    from .app import QUEUE, STORE_URL, app, durable

    print(f"celery_durable example: {args.orders} order(s), {args.workers} worker(s) x {args.concurrency} processes")
    where = f"folders in {run_dir / 'broker'}" if broker.startswith("filesystem:") else f"queue {QUEUE}"
    print(f"  broker   {broker}  ({where})")
    print(f"  store    {STORE_URL.split('?')[0]}")
    print(f"  run dir  {run_dir}" + ("  (removed at exit; --keep keeps it)" if temporary and not args.keep else ""))

    workers: list[WorkerProc] = []
    failures: list[str] = []
    interrupted = False
    try:
        workers = start_workers(args.workers, args.concurrency, run_dir, QUEUE, tag)
        wait_ready(workers, timeout=60.0)
        print(f"workers ready after {time.monotonic() - t0:.1f}s\n")
        failures += run_orders(args, tag)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the workers", flush=True)
    except Exception as exc:
        traceback.print_exc()
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        failures += stop_workers(workers)
        if QUEUE == f"example-{tag}":  # our own queue on a shared broker: leave nothing behind
            with app.connection_for_write() as conn:
                queue = app.amqp.queues[QUEUE].bind(conn.default_channel)
                queue.declare()  # kombu deletes only bindings this channel knows
                queue.delete()
        durable.shutdown()
        durable.store.close()

    if failures and not interrupted:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        for w in workers:
            print(f"\n--- last lines of {w.log} ---\n{w.tail()}", file=sys.stderr)
    ok = not failures and not interrupted
    verdict = "all outcomes as expected" if ok else "interrupted" if interrupted else "FAILED"
    print(f"\ndone in {time.monotonic() - t0:.1f}s: {verdict}")
    if temporary and not args.keep and ok:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif temporary:
        print(f"run directory kept: {run_dir}")
    return 130 if interrupted else 0 if ok else 1


def run_orders(args: argparse.Namespace, tag: str) -> list[str]:
    """Start the orders, print status changes until all end, then the summary; return failures."""
    from .workflows import fulfil_order

    t0 = time.monotonic()
    tracked: list[Tracked] = []
    for i in range(args.orders):
        scenario = SCENARIOS[i % len(SCENARIOS)]
        order = make_order(i, scenario)
        # idempotent by id: starting the same id again joins the running execution
        handle = fulfil_order.start(order, _workflow_id=f"{order.id}.{tag}")
        tracked.append(Tracked(order, scenario, handle))
        print(f"{0.0:6.2f}s  {order.id}  started    {scenario.name}: {len(order.items)} item(s), "
              f"{order.total} {order.currency}, workflow id {handle.id}")

    deadline = t0 + args.timeout
    pending = list(tracked)
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
