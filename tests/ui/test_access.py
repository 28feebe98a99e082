"""The UI on a non-loopback bind (ui/access.py): only the configured Host names are answered (DNS
rebinding), and every read needs the token unless the operator says ``--public-read``.

Regression of /work/shared/repro/trust/sec_ui_rebinding_non_loopback.py: ``durable ui --host
0.0.0.0`` served every page and the JSON API, without a token, for any Host name."""

from __future__ import annotations

import http.client
import io
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import serve
from celery_durable.ui.access import Access
from celery_durable.ui.auth import COOKIE
from tests.ui import flows
from tests.ui.conftest import TOKEN

SECRET = "CARD-4111-1111-1111-1111"


def _served(env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, str]:
    """The ASGI app ``serve`` would run, and what it printed."""
    import uvicorn

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **run_kw: served.update(app=app))
    out = io.StringIO()
    serve(SimpleNamespace(engine=env.engine), token=TOKEN, out=out, **kw)  # type: ignore[arg-type]
    return served["app"], out.getvalue()


@pytest.fixture
def seeded(env: WorkflowEnvironment) -> WorkflowEnvironment:
    env.start(flows.echo, SECRET, _workflow_id="order-1")
    return env


def test_every_interface_bind_refuses_other_host_names_and_anonymous_reads(
    seeded: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, printed = _served(seeded, monkeypatch, host="0.0.0.0", allow_hosts=["ui.example.com"])
    assert TOKEN not in printed
    assert "every page, the API and the actions need the token" in printed and "ui.example.com" in printed
    with TestClient(app, base_url="http://attacker.example:8765", follow_redirects=False) as c:
        r = c.get("/api/executions/order-1", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 400 and SECRET not in r.text  # rebinding: even with the token
    for base in ("http://ui.example.com:8765", "http://10.1.2.3:8765", "http://[fd00::1]:8765", "http://localhost"):
        with TestClient(app, base_url=base, follow_redirects=False) as c:
            r = c.get("/api/executions/order-1")
            assert r.status_code == 401 and SECRET not in r.text, base
            page = c.get("/executions/order-1", headers={"Accept": "text/html"})
            assert page.status_code == 303 and page.headers["location"] == "/login?next=%2Fexecutions%2Forder-1"
            assert c.get("/executions", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
            assert c.get("/metrics").status_code == 401
            # what the login needs stays open
            assert c.get("/healthz").text == "ok"
            assert c.get("/login").status_code == 200 and c.get("/static/ui.css").status_code == 200
            bearer = c.get("/api/executions/order-1", headers={"Authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200 and SECRET in bearer.text
            assert c.post("/login", data={"token": TOKEN}).status_code == 303  # the session cookie
            assert SECRET in c.get("/executions/order-1").text and SECRET in c.get("/api/executions/order-1").text


def test_public_read_is_the_operators_choice_and_still_checks_host_names(
    seeded: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, printed = _served(seeded, monkeypatch, host="0.0.0.0", public_read=True)
    assert "warning: --public-read" in printed and "--allow-host" in printed
    with TestClient(app, base_url="http://192.0.2.7:8765") as c:
        assert SECRET in c.get("/api/executions/order-1").text
        assert c.post("/actions/cancel", data={"id": "order-1"}).status_code == 403  # actions: the token
    with TestClient(app, base_url="http://attacker.example:8765") as c:
        assert c.get("/api/executions/order-1").status_code == 400


def test_loopback_bind_keeps_reads_open_to_loopback_names(
    seeded: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, printed = _served(seeded, monkeypatch)
    assert "pages: open to this machine" in printed
    for base in ("http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"):
        with TestClient(app, base_url=base) as c:
            assert SECRET in c.get("/api/executions/order-1").text, base
    for base in ("http://evil.example:8765", "http://127.0.0.1.nip.io:8765"):
        with TestClient(app, base_url=base) as c:
            assert c.get("/api/executions/order-1").status_code == 400, base


def _oracle(header: str, names: set[str]) -> bool:
    """Written apart from access.py: ``header`` is ``name[:port]`` and its name is localhost, an IP
    address (IPv6 in brackets) or a configured name (``*.x``: a subdomain of x)."""
    import ipaddress
    import re

    m = re.fullmatch(r"(\[[0-9a-f:.]*\]|[^:\[\]]*)(:[0-9]{1,5})?", header.strip().lower())
    if m is None:
        return False
    name = m.group(1)
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
        return True
    except ValueError:
        pass
    if not re.fullmatch(r"([a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9])(\.([a-z0-9]|[a-z0-9][a-z0-9-]*[a-z0-9]))*", name):
        return False
    wild = any(n.startswith("*.") and name.endswith(n[1:]) for n in names)
    return name == "localhost" or name in names or wild


@pytest.mark.parametrize("seed", range(5))
def test_host_check_against_an_oracle_on_crafted_names(seed: int) -> None:
    rng = random.Random(seed)
    names = {"ui.example.com", "*.corp.example"}
    access = Access.for_bind("0.0.0.0", names)
    parts = ["ui.example.com", "corp.example", "a.corp.example", "localhost", "127.0.0.1", "[::1]", "10.0.0.1"]
    parts += ["evil.example", "nip.io", "ui", "example.com", "@", ".", "-", "UI.Example.COM", "", "::1", "0x7f000001"]
    seps = ["", ".", ":", ":8765", "@", " ", ":80:90"]
    for _ in range(2000):
        header = "".join(rng.choice(parts) + rng.choice(seps) for _ in range(rng.randint(1, 3)))
        assert access.host_ok(header) == _oracle(header, names), header


@pytest.mark.parametrize("seed", range(3))
def test_no_anonymous_or_rebound_request_ever_reads_a_payload(
    seeded: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random requests (host, credentials, path, method, Accept): the payload comes back only to a
    request with an answered Host name and the token (a bearer or a real session)."""
    rng = random.Random(seed)
    app, _ = _served(seeded, monkeypatch, host="0.0.0.0", allow_hosts=["ui.example.com"])
    with TestClient(app, base_url="http://ui.example.com", follow_redirects=False) as c:
        assert c.post("/login", data={"token": TOKEN}).status_code == 303
        session = c.cookies[COOKIE]
    hosts = {"ui.example.com": True, "10.0.0.9:8765": True, "attacker.example": False, "ui.example.com.evil": False}
    creds = {
        "none": ({}, {}, False),
        "bearer": ({"Authorization": f"Bearer {TOKEN}"}, {}, True),
        "bad-bearer": ({"Authorization": f"Bearer {TOKEN}x"}, {}, False),
        "basic": ({"Authorization": f"Basic {TOKEN}"}, {}, False),
        "session": ({}, {COOKIE: session}, True),
        "forged-session": ({}, {COOKIE: session.split(".")[0] + ".00"}, False),
    }
    paths = [
        "/api/executions/order-1",
        "/executions/order-1",
        "/executions",
        "/lanes?key=order-1",
        "/executions/",
        "/effects",
    ]
    with TestClient(app, follow_redirects=False) as c:
        for _ in range(150):
            host, cred = rng.choice(list(hosts)), rng.choice(list(creds))
            headers, cookies, authed = creds[cred]
            c.cookies.clear()
            for k, v in cookies.items():
                c.cookies.set(k, v)
            method = rng.choice(["GET", "GET", "HEAD"])
            accept = rng.choice(["text/html", "application/json", "*/*"])
            r = c.request(method, rng.choice(paths), headers={"Host": host, "Accept": accept, **headers})
            if SECRET in r.text:
                assert hosts[host] and authed, (host, cred, r.status_code)
            if not hosts[host]:
                assert r.status_code == 400
            elif not authed:
                assert r.status_code in (401, 303), (host, cred, r.status_code)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _get(port: int, host: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    for _ in range(100):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            c.request("GET", path, headers={"Host": host, **(headers or {})})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        except OSError:
            time.sleep(0.2)
        finally:
            c.close()
    raise AssertionError("the UI did not start")


def test_the_cli_on_every_interface(tmp_path: Path) -> None:
    """The repro, with the real ``celery … durable ui --host 0.0.0.0`` (and ``--allow-host``)."""
    (tmp_path / "rbapp.py").write_text(
        textwrap.dedent("""
        from celery import Celery
        from celery_durable import Durable
        from celery_durable import workflow as wf
        app = Celery("rbapp", broker="memory://")
        durable = Durable(app)
        @durable.workflow(name="rb.wf")
        def w(card: str) -> str:
            return wf.wait_signal("go")
        """)
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path), DURABLE_STORE_URL=f"sqlite:///{tmp_path / 'ui.db'}")
    seed = (
        "import os\nfrom rbapp import durable, w\nfrom celery_durable.testing.env import WorkflowEnvironment\n"
        "from celery_durable.stores import store_from_url\n"
        "e = WorkflowEnvironment(durable, store=store_from_url(os.environ['DURABLE_STORE_URL']))\n"
        f"e.start(w, {SECRET!r}, _workflow_id='order-1')\n"
    )
    subprocess.run([sys.executable, "-c", seed], cwd=tmp_path, env=env, check=True, timeout=60)
    port = _free_port()
    cmd = [sys.executable, "-m", "celery", "-A", "rbapp", "durable", "ui", "--host", "0.0.0.0", "--port", str(port),
           "--token", TOKEN, "--allow-host", "ui.example.com"]  # fmt: skip
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        ui = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        st, body = _get(port, f"attacker.example:{port}", "/api/executions/order-1")
        assert st == 400 and SECRET not in body
        st, body = _get(port, f"ui.example.com:{port}", "/api/executions/order-1")
        assert st == 401 and SECRET not in body
        st, body = _get(port, f"127.0.0.1:{port}", "/api/executions/order-1", {"Authorization": f"Bearer {TOKEN}"})
        assert st == 200 and SECRET in body
    finally:
        ui.terminate()
        ui.wait(10)
    printed = log.read_text()
    assert TOKEN not in printed and "need the token" in printed, printed


@pytest.mark.parametrize("bad", ["ui.example.com:8765", "*", "http://ui.example.com", "", "a b", "*.*.x"])
def test_an_allow_host_that_is_not_a_name_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--allow-host"):
        Access.for_bind("0.0.0.0", [bad])


def test_other_methods_need_the_token_too(seeded: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    app, _ = _served(seeded, monkeypatch, host="0.0.0.0")
    with TestClient(app, base_url="http://10.0.0.2:8765", follow_redirects=False) as c:
        for method in ("OPTIONS", "PUT", "DELETE", "PATCH"):
            r = c.request(method, "/api/executions/order-1")
            assert r.status_code == 401 and SECRET not in r.text, method


def test_the_ui_command_takes_allow_host_and_public_read() -> None:
    from celery.bin.celery import celery as celery_cli
    from click.testing import CliRunner

    runner = CliRunner()
    help_text = runner.invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "ui", "--help"]).output
    assert "--allow-host" in help_text and "--public-read" in help_text
    args = ["-A", "tests.apps.basic", "durable", "ui", "--host", "0.0.0.0", "--token", TOKEN]
    bad = runner.invoke(celery_cli, [*args, "--allow-host", "ui.example.com:8765"])
    assert bad.exit_code == 2 and "without a port" in bad.output
