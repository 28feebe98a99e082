"""Adversarial review of issue 14 (PostgreSQL store, web UI): each test failed on the code it fixes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from celery_durable.errors import ConfigurationError
from celery_durable.stores import store_from_url
from celery_durable.stores.base import Op
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.plugins.postgres import (  # noqa: F401 - fixtures
    BASE_URL,
    _postgres_server,
    postgres_schema,
    postgres_url,
)
from tests.ui import flows

TOKEN = "test-token-0123456789abcdef"


# --- PostgreSQL store ---------------------------------------------------------------------------


def test_postgres_keeps_a_lone_surrogate_in_a_value_and_refuses_one_in_an_id_clearly(postgres_url: str) -> None:  # noqa: F811 - fixture
    """``"\\ud800"`` is a JSON string (json.loads gives it); TEXT cannot hold it as UTF-8. It used
    to leak a bare UnicodeEncodeError from psycopg's adapter; the value is now stored escaped
    (read back equal, as the memory and Cosmos stores do) and an id holding one is refused with
    the library's ConfigurationError."""
    s = store_from_url(postgres_url)
    try:
        etag = s.create({"pk": "p", "id": "a", "v": "x\ud800y", "k\udfff": 1})
        assert etag is not None
        doc = s.read("p", "a")
        assert doc is not None and doc["v"] == "x\ud800y" and doc["k\udfff"] == 1
        s.replace({"pk": "p", "id": "a", "v": "\udc80"}, etag)
        s.batch("p", [Op.create({"pk": "p", "id": "b", "v": "\ud83d"})])
        assert [d["v"] for d in s.query_partition("p").docs] == ["\udc80", "\ud83d"]
        for bad in (lambda: s.create({"pk": "p", "id": "\ud800"}), lambda: s.read("p\udc80", "a")):
            with pytest.raises(ConfigurationError, match="surrogate"):
                bad()
        assert s.read("p", "a") is not None  # the pool still works
    finally:
        s.close()


def test_postgres_mixed_case_table_opens_for_a_role_without_create_rights(postgres_schema: str) -> None:  # noqa: F811 - fixture
    """The schema check looked the objects up unquoted (``to_regclass('MixedDocs')`` folds to
    ``mixeddocs``), so a mixed-case ``table=`` always took the CREATE path: a role with only
    read/write rights on the (existing) table could not use the store at all."""
    import psycopg

    role = f"adv14_{uuid.uuid4().hex[:8]}"
    base = BASE_URL.split("?")[0]
    owner = store_from_url(f"{base}?schema={postgres_schema}&table=MixedDocs")
    admin = psycopg.connect(base, autocommit=True)
    try:
        owner.create({"pk": "p", "id": "a", "v": 1})
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{postgres_schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{postgres_schema}"."MixedDocs" TO "{role}"')
        netloc_user = base.replace("postgres@", f"{role}@", 1)
        assert netloc_user != base
        user = store_from_url(f"{netloc_user}?schema={postgres_schema}&table=MixedDocs")
        try:
            doc = user.read("p", "a")
            assert doc is not None and doc["v"] == 1
            assert user.create({"pk": "p", "id": "b"}) is not None
        finally:
            user.close()
    finally:
        owner.close()
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        admin.close()


# --- web UI ---------------------------------------------------------------------------------------


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[tuple[WorkflowEnvironment, TestClient]]:
    flows.FLAKY.clear()
    flows.MAILS.clear()
    env = WorkflowEnvironment(flows.durable, store=SqliteStore(str(tmp_path / "ui.db")))
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False, raise_server_exceptions=False) as c:
        yield env, c


def test_ui_signal_with_a_deeply_nested_value_is_a_400_not_a_500(ui: tuple[WorkflowEnvironment, TestClient]) -> None:
    """``value=[[[[…`` (100 000 deep) made json.loads raise RecursionError: an Internal Server Error."""
    env, client = ui
    h = env.start(flows.order, "book", _workflow_id="order-1")
    r = client.post(
        "/actions/signal",
        data={"id": h.id, "name": "approve", "value": "[" * 100_000 + "]" * 100_000},
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 400, r.text
    assert "nested" in r.json()["error"]


def test_postgres_url_without_a_host_part_as_libpq_writes_it(postgres_schema: str) -> None:  # noqa: F811 - fixture
    """``postgresql:///db`` (empty authority: a Unix socket, or ``host=`` in the query) is libpq's
    usual local form; rebuilding the URL without our options dropped its ``//`` (``postgresql:/db``),
    which libpq refused as ``invalid connection option``."""
    from urllib.parse import urlsplit

    parts = urlsplit(BASE_URL)
    url = (
        f"postgresql:///{parts.path.lstrip('/')}?host={parts.hostname}&port={parts.port or 5432}"
        f"&user={parts.username or 'postgres'}&schema={postgres_schema}"
    )
    s = store_from_url(url)
    try:
        assert s.create({"pk": "p", "id": "a"}) is not None
        assert s.read("p", "a") is not None
    finally:
        s.close()


def test_ui_on_loopback_refuses_other_host_names_against_dns_rebinding(
    ui: tuple[WorkflowEnvironment, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads need no token because the UI binds 127.0.0.1. A page on ``evil.example`` whose name
    the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin with the UI in the browser,
    so it could read every execution's input and result: served on loopback, the UI must answer
    only requests addressed to a loopback name."""
    import io
    from types import SimpleNamespace
    from typing import Any

    import uvicorn

    from celery_durable.ui import serve

    env, _ = ui
    env.start(flows.echo, "secret-input", _workflow_id="echo-1")
    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    serve(SimpleNamespace(engine=env.engine), token=TOKEN, out=io.StringIO())  # type: ignore[arg-type]
    with TestClient(served["app"], base_url="http://evil.example:8765") as c:
        r = c.get("/api/executions/echo-1")
        assert r.status_code == 400 and "secret-input" not in r.text
    for base in ("http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"):
        with TestClient(served["app"], base_url=base) as c:
            assert c.get("/api/executions/echo-1").status_code == 200, base
    # bound to every interface: only the names the operator gives, and reads need the token
    # (tests/ui/test_access.py has the rest)
    serve(SimpleNamespace(engine=env.engine), host="0.0.0.0", token=TOKEN, out=io.StringIO())  # type: ignore[arg-type]
    with TestClient(served["app"], base_url="http://ui.internal:8765") as c:
        assert c.get("/api/executions/echo-1").status_code == 400
    durable: Any = SimpleNamespace(engine=env.engine)
    serve(durable, host="0.0.0.0", token=TOKEN, out=io.StringIO(), allow_hosts=["ui.internal"])
    with TestClient(served["app"], base_url="http://ui.internal:8765") as c:
        assert c.get("/api/executions/echo-1").status_code == 401
        assert c.get("/api/executions/echo-1", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
