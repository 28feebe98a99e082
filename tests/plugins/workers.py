"""Real ``celery worker`` processes for integration tests.

pytest-celery 1.3's worker fixtures need Docker, which these machines do not run, so the
harness starts the same ``celery -A … worker`` command an operator would, as subprocesses,
and waits on the ``worker_ready`` signal (the test app writes a ready file) — no sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["Worker", "WorkerFactory", "wait_until", "broker_url"]

REPO = Path(__file__).resolve().parents[2]


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    name: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group (the main process and its pool children)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@dataclass
class WorkerFactory:
    tmp: Path
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)

    def start(
        self,
        app: str = "tests.apps.basic",
        concurrency: int = 2,
        pool: str = "prefork",
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 60.0,
    ) -> Worker:
        name = f"w{len(self.workers)}-{uuid.uuid4().hex[:6]}"
        ready = self.tmp / f"{name}.ready"
        log_path = self.tmp / f"{name}.log"
        full_env = dict(os.environ) | self.env | (env or {}) | {"TEST_READY_FILE": str(ready)}
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
        ] + (extra or [])
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        worker = Worker(proc, log_path, ready, name)
        self.workers.append(worker)

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited with {proc.returncode}:\n{worker.log()[-4000:]}")
            return ready.exists()

        wait_until(up, timeout=ready_timeout, what=f"worker {name} to be ready")
        return worker

    def start_beat(self, app: str = "tests.apps.basic", env: dict[str, str] | None = None) -> Worker:
        """A ``celery beat`` process with its own schedule file; ready once it logs its start."""
        name = f"beat{len(self.workers)}-{uuid.uuid4().hex[:6]}"
        log_path = self.tmp / f"{name}.log"
        full_env = dict(os.environ) | self.env | (env or {})
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "beat",
            "-s",
            str(self.tmp / f"{name}.schedule"),
            "--loglevel=DEBUG",
            "--max-interval",
            "1",
        ]
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        beat = Worker(proc, log_path, self.tmp / f"{name}.none", name)
        self.workers.append(beat)

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"beat exited with {proc.returncode}:\n{beat.log()[-4000:]}")
            return "beat: Starting" in beat.log()

        wait_until(up, timeout=30, what=f"{name} to start")
        return beat

    def stop_all(self) -> None:
        for w in self.workers:
            w.stop()


def broker_url(kind: str, tmp: Path) -> tuple[str, dict[str, str]]:
    """A broker URL (and transport options) isolated for one test."""
    if kind == "redis":
        return "redis://127.0.0.1:6379/15", {}
    if kind == "rabbitmq":
        return "amqp://guest:guest@127.0.0.1:5672//", {}
    if kind == "filesystem":
        folder = tmp / "broker"
        for sub in ("in", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        opts = {
            "data_folder_in": str(folder / "in"),
            "data_folder_out": str(folder / "in"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.05,
        }
        return "filesystem://", opts
    raise ValueError(kind)


@pytest.fixture
def worker_factory(tmp_path: Path) -> Iterator[WorkerFactory]:
    factory = WorkerFactory(tmp=tmp_path, env={"TEST_MARKS_DIR": str(tmp_path / "marks")})
    try:
        yield factory
    finally:
        factory.stop_all()
