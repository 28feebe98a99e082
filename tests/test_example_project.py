"""``python -m example_project`` end to end: real workers, every scenario, clean exit."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.worker

REPO = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/14"


def run_example(
    *args: str, env: dict[str, str] | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EXAMPLE_") and k != "DURABLE_STORE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "example_project", *args],
        cwd=REPO,
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def summary(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows by order id: [scenario, status, result, steps, elapsed]."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("order ") and "scenario" in line)
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return rows


def check_outcomes(proc: subprocess.CompletedProcess[str], orders: int) -> dict[str, list[str]]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "all outcomes as expected" in proc.stdout
    rows = summary(proc.stdout)
    assert len(rows) == orders, proc.stdout
    expected = {
        "SO-1001": ("standard", "shipped", "charged in 1 attempt(s)"),
        "SO-1002": ("flaky-gateway", "shipped", "charged in 2 attempt(s)"),  # Celery retried the charge
        # retries exhausted: the workflow caught ActivityError and released the stock
        "SO-1003": ("gateway-down", "cancelled", "PaymentGatewayError after 4 attempt(s); undone: released"),
        "SO-1004": ("card-declined", "cancelled", "charge_card: CardDeclined after 1 attempt(s); undone: released"),
        "SO-1005": ("bad-address", "cancelled", "ship: AddressRejected after 1 attempt(s); undone: refunded, released"),
        # waited for its release date on a timer longer than durable_timer_fast_path_max: beat fired it
        "SO-1006": ("pre-order", "shipped", "charged in 1 attempt(s)"),
        # its worker was SIGKILLed mid-step: the lease lapsed and beat's recovery re-sent the step
        "SO-1007": ("worker-crash", "shipped", "charged in 1 attempt(s)"),
    }
    for order, (scenario, status, result) in list(expected.items())[:orders]:
        got = rows[order]
        assert got[:2] == [scenario, status], got
        assert result in got[2], got
        assert int(got[3]) >= 5, got  # steps
    return rows


def test_embedded_defaults(tmp_path: Path) -> None:
    """SQLite + filesystem broker in a fresh temporary run dir, removed at exit; workers and beat."""
    before = set(os.listdir(REPO))
    proc = run_example(env={"TMPDIR": str(tmp_path)})
    rows = check_outcomes(proc, orders=7)
    assert "workers and beat ready" in proc.stdout
    assert float(rows["SO-1006"][4].rstrip("s")) >= 3.0, rows["SO-1006"]  # it slept until its release date
    killed = re.findall(r"SO-1007  (worker\d) killed \(SIGKILL\) while packing", proc.stdout)
    assert len(killed) == 1, proc.stdout
    # the order completed after the kill, on the worker that was left
    after_kill = proc.stdout.split("killed (SIGKILL)", 1)[1]
    assert re.search(r"SO-1007  completed", after_kill), proc.stdout
    # shipped orders name the workers that packed them (both may or may not get a share)
    packers = {w for r in rows.values() if r[1] == "shipped" for w in re.findall(r"\((\S+)\)", r[2])[0].split("+")}
    assert packers and packers <= {"worker1", "worker2"}, rows
    assert "filesystem://" in proc.stdout and "sqlite:///" in proc.stdout
    assert not list(tmp_path.glob("celery-durable-example-*")), "the temporary run dir was not removed"
    assert {n for n in set(os.listdir(REPO)) - before if not n.startswith(".pytest")} == set()


def test_run_dir_is_kept_and_holds_everything(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_example("--run-dir", str(run), "--orders", "3", "--workers", "1")
    check_outcomes(proc, orders=3)
    assert (run / "durable.db").exists()
    assert {p.name for p in (run / "broker").iterdir()} == {"queue", "processed", "control"}
    assert not list((run / "broker" / "queue").iterdir()), "messages left in the queue"
    assert sorted(p.name for p in (run / "outbox").iterdir()) == ["SO-1001.txt", "SO-1002.txt", "SO-1003.txt"]
    assert "could not fulfil" in (run / "outbox" / "SO-1003.txt").read_text()
    assert (run / "worker1.log").exists()


def test_bad_arguments() -> None:
    proc = run_example("--orders", "0", timeout=30)
    assert proc.returncode == 2 and "--orders" in proc.stderr


def _redis_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        return True
    except OSError:
        return False


def require_redis() -> None:
    if not _redis_up():
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("Redis is not running at 127.0.0.1:6379")
        pytest.skip("Redis is not running at 127.0.0.1:6379")


@pytest.mark.redis
def test_redis_broker_sqlite_store(tmp_path: Path) -> None:
    require_redis()
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    proc = run_example(
        "--run-dir", str(tmp_path / "run"), "--workers", "1", "--orders", "5", env={"EXAMPLE_BROKER_URL": REDIS_URL}
    )
    check_outcomes(proc, orders=5)
    assert REDIS_URL in proc.stdout
    queue = re.search(r"\(queue (example-\w+)\)", proc.stdout)  # the run used a queue of its own ...
    assert queue is not None, proc.stdout
    # ... and deleted it: no message or binding of this run is left on the shared broker
    assert not client.keys(f"*{queue.group(1)}*")


@pytest.mark.redis
@pytest.mark.cosmos
def test_redis_broker_cosmos_store(tmp_path: Path, cosmos_url: str) -> None:
    require_redis()
    env = {"EXAMPLE_BROKER_URL": REDIS_URL, "DURABLE_STORE_URL": cosmos_url}
    proc = run_example("--run-dir", str(tmp_path / "run"), "--orders", "3", env=env)
    check_outcomes(proc, orders=3)
    assert "store    cosmos://127.0.0.1" in proc.stdout
    assert "key=" not in proc.stdout + proc.stderr  # the account key is never printed
    assert not (tmp_path / "run" / "durable.db").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ui_keeps_running_with_its_urls_until_ctrl_c(tmp_path: Path) -> None:
    """--ui: after the orders, the web timeline, Flower and the workers' metrics until Ctrl-C."""
    import signal
    import time
    import urllib.request

    ports = {name: _free_port() for name in ("ui", "flower", "metrics")}
    base = {k: v for k, v in os.environ.items() if not k.startswith("EXAMPLE_") and k != "DURABLE_STORE_URL"}
    args = ["--ui", "--orders", "1", "--workers", "1", "--run-dir", str(tmp_path / "run")]
    args += ["--ui-port", str(ports["ui"]), "--flower-port", str(ports["flower"])]
    args += ["--metrics-port", str(ports["metrics"])]
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_project", *args],
            cwd=REPO, env=base, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "running until Ctrl-C" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        text = out.read_text()
        assert f"metrics       http://127.0.0.1:{ports['metrics']}/metrics  (worker1" in text
        assert f"Flower        http://127.0.0.1:{ports['flower']}/" in text
        assert f"http://127.0.0.1:{ports['ui']}/" in text or "web timeline  not installed" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'celery_durable_executions_total{status="completed",workflow="example.fulfil_order"} 1.0' in metrics
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "done in" in out.read_text() and "all outcomes as expected" in out.read_text()


def test_a_worker_stuck_in_its_shutdown_shows_its_stacks_before_it_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that does not stop on SIGTERM is killed, but first each of its processes writes
    where its threads stand (app.STACK_DUMP_SIGNAL): the only clue a CI run keeps of a hang.
    A SIGSTOPped pool child makes the warm shutdown wait for ever, as a hung one would."""
    import signal

    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("EXAMPLE_RUN_DIR", str(tmp_path))
    from example_project.__main__ import Fleet, stop_workers, wait_ready

    fleet = Fleet(tmp_path, "example", "stuck", concurrency=2)
    worker = fleet.start_worker()
    try:
        wait_ready([worker], timeout=60)
        children = subprocess.run(
            ["pgrep", "-P", str(worker.proc.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(children) == 2, children
        os.kill(int(children[0]), signal.SIGSTOP)
        problems = stop_workers([worker], timeout=3)
    finally:
        if worker.proc.poll() is None:
            os.killpg(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
    assert problems == [f"worker1 ignored SIGTERM for 3s: killed (its stacks are in {worker.log})"]
    log = worker.log.read_text()
    # the main process dumps its threads (the other child had exited, the stopped one cannot)
    assert "Warm shutdown" in log
    dump = log[log.index("Warm shutdown") :]
    assert dump.count("Current thread") == 1 and "celery/worker/" in dump, log[-3000:]
    assert worker.stuck and "Current thread" in worker.tail(400)
