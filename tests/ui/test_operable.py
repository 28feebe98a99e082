"""What an operator triaging failures needs from the UI, ``show`` and ``describe()`` (issue 25):
a failed execution's error in the listing, each activity's input, the stack trace of the line
that raised; a store outage answered 503 and a store the UI cannot use refused at start."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.engine.admin.operator import Admin
from celery_durable.errors import StoreUnavailable
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app, serve
from tests.ui import flows
from tests.ui.conftest import TOKEN


@flows.durable.workflow(name="ui.fails_at_two")
def fails_at_two(order_id: str) -> int:
    flows.add(1, 2)
    return int(flows.refuses(f"order {order_id} refused"))


def test_a_failed_execution_is_listed_with_its_error(env: WorkflowEnvironment, client: TestClient) -> None:
    h = env.start(fails_at_two, "o-1", _workflow_id="lf-1")
    env.run_until_idle()
    assert h.status() == "failed"
    rows = env.list_executions(status="failed").executions
    assert [r.last_error for r in rows] == [
        "ActivityError: activity 'ui.refuses' failed after 1 attempt(s): NonRetryableError: order o-1 refused"
    ]
    assert "order o-1 refused" in client.get("/executions?status=failed").text  # the UI's column


def test_each_step_shows_its_input_and_the_line_that_raised(env: WorkflowEnvironment, client: TestClient) -> None:
    h = env.start(fails_at_two, "o-2", _workflow_id="in-1")
    env.run_until_idle()
    steps = Admin(env.engine).describe(h.id).steps
    assert [s.input for s in steps] == [{"args": [1, 2], "kwargs": {}}, {"args": ["order o-2 refused"], "kwargs": {}}]
    page = client.get("/executions/in-1").text
    squashed = page.replace("&#34;", '"').replace("\n", "").replace(" ", "")
    assert '"args":[1,2]' in squashed and '"args":["ordero-2refused"]' in squashed
    outcome = env.engine.store.read(h.id, "r:000002")
    assert outcome is not None
    # the innermost frames: the activity's own line, not only the machinery that called it
    assert "raise NonRetryableError(why)" in outcome["error"]["traceback"]


def test_show_prints_each_steps_input(env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from celery_durable.cli.commands import durable as durable_cli

    env.start(fails_at_two, "o-3", _workflow_id="sh-1")
    env.run_until_idle()
    admin = Admin(env.engine)
    monkeypatch.setattr("celery_durable.cli.commands._durable", lambda ctx: SimpleNamespace(describe=admin.describe))
    out = CliRunner().invoke(durable_cli, ["show", "sh-1"], obj=SimpleNamespace())
    assert 'step 1 input: {"args": [1, 2], "kwargs": {}}' in out.output, out.output
    assert 'step 2 input: {"args": ["order o-3 refused"], "kwargs": {}}' in out.output


class DownStore(MemoryStore):
    """A store whose every read fails as an outage does."""

    def read(self, pk: str, doc_id: str) -> Any:
        raise StoreUnavailable("the database is down")

    def list_execs(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is down")

    def query_partition(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is down")

    def read_many(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("the database is down")


def test_a_store_outage_is_a_503(env: WorkflowEnvironment) -> None:
    down = WorkflowEnvironment(flows.durable, store=DownStore())
    with TestClient(create_app(down.engine, TOKEN), follow_redirects=False) as c:
        for path in ("/healthz", "/executions", "/executions/x"):
            r = c.get(path)
            assert r.status_code == 503 and "the database is down" in r.text, (path, r.status_code)
        r = c.get("/executions", headers={"accept": "application/json"})
        assert r.status_code == 503


def test_serve_refuses_a_store_it_cannot_use() -> None:
    out = io.StringIO()
    down = WorkflowEnvironment(flows.durable, store=DownStore())
    with pytest.raises(SystemExit, match="cannot use the store, not starting the UI: StoreUnavailable"):
        serve(SimpleNamespace(engine=down.engine), token=TOKEN, out=out)  # type: ignore[arg-type]
    assert "UI on http" not in out.getvalue()


def test_the_ui_command_exits_on_an_unreachable_store(tmp_path: Path) -> None:
    Path(tmp_path, "ui_down_app.py").write_text(
        textwrap.dedent(
            """
            from celery import Celery
            from celery_durable import Durable
            app = Celery("ui_down_app", broker="memory://")
            app.conf.durable_store_url = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1"
            durable = Durable(app)
            """
        )
    )
    cmd = [sys.executable, "-m", "celery", "-A", "ui_down_app", "durable", "ui", "--port", "8798", "--token", TOKEN]
    done = subprocess.run(
        cmd, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "cannot use the store, not starting the UI" in done.stderr, done.stderr


def test_a_signal_to_an_ended_execution_exits_non_zero(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from celery_durable.cli.commands import durable as durable_cli

    h = env.start(flows.echo, "hi", _workflow_id="ended-1")
    env.run_until_idle()
    assert h.status() == "completed"
    admin = Admin(env.engine)
    fake = SimpleNamespace(describe=admin.describe, engine=env.engine, registry=env.engine.registry)
    monkeypatch.setattr("celery_durable.cli.commands._durable", lambda ctx: fake)
    out = CliRunner().invoke(durable_cli, ["signal", "ended-1", "approve", "true"], obj=SimpleNamespace())
    assert out.exit_code == 1, out.output
    assert "not delivered: execution 'ended-1' has ended" in out.output
