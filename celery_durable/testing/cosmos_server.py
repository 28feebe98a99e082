"""A local Cosmos DB for tests: ``@vercel/cosmosdb-server`` behind our corrective wrapper.

No Docker here, so no Cosmos emulator: :class:`CosmosTestServer` installs the npm package
``@vercel/cosmosdb-server@1.0.1`` once into a cache directory (``$CELERY_DURABLE_CACHE``, default
``~/.cache/celery_durable/cosmos-server``) and runs ``cosmos_server.js`` next to this file, which
fixes the package's deviations from real Cosmos (listed at the top of that file and in
``docs/cosmos-test-server.md``), adds fault injection and outage control, and keeps connections
alive. Needs ``node`` >= 20 and ``npm`` on ``PATH`` (or ``$CELERY_DURABLE_NODE`` / ``$CELERY_DURABLE_NPM``).

    with CosmosTestServer() as server:
        store = store_from_url(server.url_for("db", "c1"))
        server.inject_fault(429, count=3, retry_after_ms=50)   # next 3 document requests throttled
        server.restart(downtime=1.0)                            # outage window, data kept
        server.set_replica_lag(300)     # tokenless reads may see the previous version for 300 ms

``python -m celery_durable.testing.cosmos_server`` starts one and prints a store URL until Ctrl-C.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["CosmosTestServer", "CosmosServerError", "PACKAGE", "ensure_installed", "default_cache_dir"]

#: The npm package (pinned: the wrapper uses its internals).
PACKAGE = "@vercel/cosmosdb-server@1.0.1"
_PACKAGE_DIR = ("node_modules", "@vercel", "cosmosdb-server")
_SCRIPT = Path(__file__).with_name("cosmos_server.js")


class CosmosServerError(RuntimeError):
    """The test server could not be installed or started."""


def default_cache_dir() -> Path:
    env = os.environ.get("CELERY_DURABLE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "celery_durable" / "cosmos-server"


def _tool(name: str) -> str:
    path = os.environ.get(f"CELERY_DURABLE_{name.upper()}") or shutil.which(name)
    if not path:
        raise CosmosServerError(f"{name!r} not found on PATH (Node.js >= 20 is needed for the Cosmos test server)")
    return path


def _installed(cache_dir: Path) -> bool:
    manifest = cache_dir.joinpath(*_PACKAGE_DIR, "package.json")
    try:
        return bool(json.loads(manifest.read_text())["version"] == PACKAGE.rsplit("@", 1)[1])
    except (OSError, ValueError, KeyError):
        return False


def ensure_installed(cache_dir: Path | None = None, *, timeout: float = 300.0) -> Path:
    """Install the npm package into ``cache_dir`` unless it is already there; return ``cache_dir``.

    A file lock serialises concurrent installs (pytest-xdist workers).
    """
    cache_dir = cache_dir or default_cache_dir()
    if _installed(cache_dir):
        return cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(cache_dir):
            return cache_dir
        manifest = cache_dir / "package.json"
        if not manifest.exists():
            manifest.write_text(json.dumps({"name": "celery-durable-cosmos-server", "private": True}) + "\n")
        cmd = [_tool("npm"), "install", "--no-audit", "--no-fund", "--loglevel=error", PACKAGE]
        try:
            proc = subprocess.run(cmd, cwd=cache_dir, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CosmosServerError(f"npm install {PACKAGE} failed: {exc}") from exc
        if proc.returncode != 0 or not _installed(cache_dir):
            tail = (proc.stderr or proc.stdout)[-2000:]
            raise CosmosServerError(f"npm install {PACKAGE} failed (exit {proc.returncode}):\n{tail}")
    return cache_dir


class CosmosTestServer:
    """One Node process serving the Cosmos REST API on ``127.0.0.1`` over HTTPS.

    Data lives in the Node process: :meth:`restart` / :meth:`pause` keep it (the listener goes
    away, the process stays), :meth:`stop` loses it.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cache_dir: Path | None = None,
        key: str | None = None,
        startup_timeout: float = 60.0,
        replica_lag_ms: int = 0,
    ) -> None:
        self.host = host
        self.port = port
        self.control_port = 0
        self.cache_dir = cache_dir or default_cache_dir()
        #: The account key clients must use. The server accepts any key; a random one lets tests
        #: check that it never leaks into logs or error messages.
        self.key = key or base64.b64encode(os.urandom(64)).decode("ascii")
        self.startup_timeout = startup_timeout
        #: Replica-lag mode (0: off): a read without a session token at least as new as a
        #: document's last write may see its previous version for this long (see the JS file).
        self.replica_lag_ms = replica_lag_ms
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<CosmosTestServer {self.endpoint} {state}>"

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def endpoint(self) -> str:
        return f"https://{self.host}:{self.port}/"

    @property
    def log_path(self) -> Path | None:
        """The Node process's stdout/stderr."""
        return self._log_path

    def start(self) -> CosmosTestServer:
        """Install if needed, start the process and wait until it accepts requests."""
        if self.running:
            return self
        cache = ensure_installed(self.cache_dir)
        fd, log_name = tempfile.mkstemp(prefix="cosmos-test-server-", suffix=".log")
        os.close(fd)
        self._log_path = Path(log_name)
        cmd = [
            _tool("node"),
            str(_SCRIPT),
            "--package-dir",
            str(cache),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--control-port",
            str(self.control_port),
            "--parent-pid",
            str(os.getpid()),
            "--replica-lag-ms",
            str(int(self.replica_lag_ms)),
        ]
        with open(self._log_path, "wb") as log:
            try:
                self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise CosmosServerError(f"cannot run {cmd[0]!r}: {exc}") from exc
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            ready = self._ready_line()
            if ready is not None:
                self.port, self.control_port = int(ready["port"]), int(ready["controlPort"])
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        log_tail = self._log_tail()
        self.stop()
        raise CosmosServerError(f"Cosmos test server did not start:\n{log_tail}")

    def stop(self) -> None:
        """Terminate the process (its data is lost)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def restart(self, downtime: float = 0.0) -> None:
        """An outage window on the same port: connections are cut, the port refuses connections
        for ``downtime`` seconds, then the server answers again with its data intact.

        Returns once the server answers again. Starts the process (same port, empty) if it was
        stopped.
        """
        if not self.running:
            self.start()
            return
        self.pause()
        if downtime > 0:
            time.sleep(downtime)
        self.resume()

    def pause(self) -> None:
        """Stop listening and cut every open connection (requests fail as on a network outage)."""
        self._control("POST", "/pause")

    def resume(self) -> None:
        """Listen again on the same port after :meth:`pause`."""
        self._control("POST", "/resume")

    # --- URLs ------------------------------------------------------------------------------

    def url_for(self, database: str, container: str, **params: Any) -> str:
        """A ``cosmos://`` store URL for this server (key included, TLS verification off)."""
        query: dict[str, Any] = {"database": database, "container": container, "verify": "false", "key": self.key}
        query.update({k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()})
        return f"cosmos://{self.host}:{self.port}/?{urlencode(query, quote_via=quote)}"

    # --- fault injection & stats -----------------------------------------------------------

    def inject_fault(
        self,
        status: int = 429,
        *,
        count: int = 1,
        retry_after_ms: int = 100,
        match: str = "/docs",
        delay_ms: int = 0,
        drop: bool = False,
    ) -> None:
        """Make the next ``count`` requests matching the regex ``match`` fail.

        ``match`` is searched in ``"METHOD[_QUERY|_UPSERT|_BATCH] /path"`` (default: document
        requests). ``status`` 429 answers with ``x-ms-retry-after-ms: retry_after_ms``; ``status=0``
        with ``delay_ms`` only delays; ``drop=True`` closes the connection without an answer.
        """
        self._control(
            "POST",
            "/faults",
            {
                "status": status,
                "count": count,
                "retryAfterMs": retry_after_ms,
                "match": match,
                "delayMs": delay_ms,
                "drop": drop,
            },
        )

    def set_replica_lag(self, ms: int) -> None:
        """Replica-lag mode from now on: for ``ms`` milliseconds after a write, point reads and
        single-partition queries without a session token at least as new as the write see the
        document's previous version (or none); ``0`` turns it off."""
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(f"replica lag must be a non-negative integer of milliseconds, got {ms!r}")
        self._control("POST", "/replica-lag", {"ms": ms})
        self.replica_lag_ms = ms

    def clear_faults(self) -> None:
        self._control("DELETE", "/faults")

    def stats(self) -> dict[str, Any]:
        """Since the last reset: ``{"total": n, "ops": {"read": n, "query": n, ...}, "queryDocs": n,
        "queryScanned": n, "faults": n, "staleReads": n}`` (requests, served requests by operation,
        documents returned by queries, items the query engine evaluated, injected faults, reads
        served an older version by the replica-lag mode)."""
        stats: dict[str, Any] = self._control("GET", "/stats")
        return stats

    def reset_stats(self) -> None:
        self._control("DELETE", "/stats")

    # --- internals -------------------------------------------------------------------------

    def _ready_line(self) -> dict[str, Any] | None:
        assert self._log_path is not None
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("READY "):
                ready: dict[str, Any] = json.loads(line[6:])
                return ready
        return None

    def _log_tail(self, size: int = 4000) -> str:
        if self._log_path is None:
            return ""
        with contextlib.suppress(OSError):
            return self._log_path.read_text(errors="replace")[-size:]
        return ""

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not self.running:
            raise CosmosServerError("the Cosmos test server is not running")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}{path}",
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except (urllib.error.URLError, OSError) as exc:
            raise CosmosServerError(f"control request {method} {path} failed: {exc}") from exc

    def __enter__(self) -> CosmosTestServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # a forgotten server must not outlive the interpreter
        with contextlib.suppress(Exception):
            self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m celery_durable.testing.cosmos_server",
        description="Run the Cosmos DB test server until Ctrl-C and print a store URL.",
    )
    parser.add_argument("--port", type=int, default=8081, help="HTTPS port (0: any free port; default 8081)")
    parser.add_argument("--database", default="durable")
    parser.add_argument("--container", default="durable")
    parser.add_argument("--key", default=None, help="account key to put in the URL (any key works)")
    parser.add_argument("--replica-lag-ms", type=int, default=0, help="replica-lag mode (0: off)")
    args = parser.parse_args(argv)
    server = CosmosTestServer(port=args.port, key=args.key, replica_lag_ms=args.replica_lag_ms)
    try:
        server.start()
    except CosmosServerError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"Cosmos test server on {server.endpoint} (control port {server.control_port})", flush=True)
    print(server.url_for(args.database, args.container), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below
    try:
        while server.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
