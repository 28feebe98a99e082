"""Start-up of a real ``celery worker``: a wrong store fails it at once, secrets stay hidden.

A worker whose store URL is wrong or unreachable used to report "ready" and then fail every
drive. It must exit non-zero before it is ready, quickly, with one line saying why (and never the
key of the URL). ``celery inspect conf`` of a running worker must not show the key either.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.plugins.workers import REPO, WorkerFactory, broker_url, wait_until

SECRET = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="
#: a refused worker must be gone well before this (Celery's own start-up takes ~1-2 s here)
EXIT_WITHIN = 20.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    url, opts = broker_url("redis", tmp)
    return (
        dict(os.environ)
        | {
            "TEST_BROKER_URL": url,
            "TEST_BROKER_OPTIONS": json.dumps(opts),
            "TEST_QUEUE": f"q-{uuid.uuid4().hex[:10]}",
            "TEST_MARKS_DIR": str(tmp / "marks"),
        }
        | extra
    )


def _refused(tmp: Path, env: dict[str, str], extra: list[str] | None = None) -> tuple[int, str, str, float]:
    """Start a worker that must refuse: (exit code, stdout, stderr, seconds until it exited)."""
    ready = tmp / f"refused-{uuid.uuid4().hex[:6]}.ready"
    cmd = [sys.executable, "-m", "celery", "-A", "tests.apps.basic", "worker", "-P", "threads", "-c", "2"]
    cmd += ["--loglevel=INFO", "--without-gossip", "--without-mingle", *(extra or [])]
    out_path, err_path = ready.with_suffix(".out"), ready.with_suffix(".err")
    started = time.monotonic()
    # files, not pipes: nothing reads a pipe while the worker starts
    with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env | {"TEST_READY_FILE": str(ready)},
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,
        )
    try:
        wait_until(lambda: proc.poll() is not None or ready.exists(), timeout=EXIT_WITHIN, what="the worker to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    took = time.monotonic() - started
    out, err = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    assert not ready.exists(), f"the worker got ready:\n{(out + err)[-3000:]}"
    return proc.returncode, out, err, took


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        pytest.param("sqlit:///{tmp}/durable.db", "unknown store URL scheme 'sqlit'", id="unknown-scheme"),
        pytest.param("sqlite:///{tmp}/no/such/dir/durable.db", "unable to open database file", id="missing-dir"),
        # /proc refuses new files even to root (a chmod'ed directory would not stop root)
        pytest.param("sqlite:////proc/celery_durable_test.db", "unable to open database file", id="unwritable-dir"),
        pytest.param(
            "cosmos://127.0.0.1:{port}/?database=d&container=c&verify=false&key=" + SECRET,
            "Connection refused",
            id="cosmos-closed-port",
        ),
    ],
)
def test_a_worker_with_a_bad_store_fails_at_start_with_one_line(tmp_path: Path, url: str, reason: str) -> None:
    url = url.format(tmp=tmp_path, port=_closed_port())
    code, out, err, took = _refused(tmp_path, _env(tmp_path, DURABLE_STORE_URL=url))
    both = out + err
    assert code != 0, both[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, f"nothing on stderr:\n{both[-3000:]}"
    message = lines[-1]
    assert message.startswith("celery_durable: "), both[-3000:]
    assert reason in message, both[-3000:]
    assert "Traceback" not in both, both[-3000:]
    assert sum("celery_durable: " in line for line in both.splitlines()) == 1, both[-3000:]
    assert SECRET not in both
    assert took < EXIT_WITHIN


def test_a_typo_in_a_setting_fails_the_worker_at_start(tmp_path: Path) -> None:
    # extra ``key=(type)value`` arguments are Celery's own way to set config on the command line
    store = f"sqlite:///{tmp_path / 'durable.db'}"
    code, out, err, _ = _refused(
        tmp_path, _env(tmp_path, DURABLE_STORE_URL=store), extra=["--", f"durable_stor_url=(string){store}"]
    )
    assert code != 0, (out + err)[-3000:]
    message = [line for line in err.splitlines() if line.strip()][-1]
    assert message.startswith("celery_durable: ") and "did you mean 'durable_store_url'" in message, err[-3000:]


def test_inspect_conf_of_a_running_worker_hides_the_store_key(worker_factory: WorkerFactory, cosmos_url: str) -> None:
    assert "key=" in cosmos_url
    raw = dict(part.split("=", 1) for part in cosmos_url.split("?", 1)[1].split("&"))["key"]
    env = _env(worker_factory.tmp)
    worker = worker_factory.start(
        pool="threads",
        env={k: env[k] for k in ("TEST_BROKER_URL", "TEST_QUEUE")},
        extra=["--", f"durable_store_url=(string){cosmos_url}"],
    )
    shown = {}
    for command in ("conf", "report"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.apps.basic",
                "inspect",
                command,
                "-d",
                f"{worker.name}@{socket.gethostname()}",
                "--json",
                "-t",
                "10",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=60,
        )
        shown[command] = result.stdout.decode(errors="replace")
        assert result.returncode == 0, (shown[command] + result.stderr.decode(errors="replace"))[-3000:]
    assert "durable_store_url" in shown["conf"], shown["conf"][-3000:]
    for command, text in shown.items():
        assert raw not in text and unquote(raw) not in text, f"the key shows in inspect {command}"
    assert "***" in shown["conf"]
