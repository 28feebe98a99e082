"""Breakers: ``--json`` output (celery_durable/cli/json_out.py): "one JSON document, nothing else"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from celery import Celery

from celery_durable import Durable
from celery_durable.cli import json_out
from celery_durable.engine.admin.operator import Admin
from celery_durable.stores.base import strip_reserved
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui.views import detail_json

app = Celery("breaker-json", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="brk.ratio")
def ratio(x: float) -> float:
    return x * 2


def _strict(text: str) -> object:
    def refuse(const: str) -> object:
        raise ValueError(f"{const} is not JSON (RFC 8259)")

    return json.loads(text, parse_constant=refuse)


def test_show_json_of_an_execution_with_a_corrupt_time_is_valid_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = WorkflowEnvironment(durable, store=SqliteStore(str(tmp_path / "j.db")))
    h = env.start(ratio, 2.0, _workflow_id="r")
    ex = env.engine.store.read(h.id, "exec")
    assert ex is not None and ex["status"] == "completed"
    # a corrupt time (wording.iso: "a corrupt non-finite ... number as it is"); the store keeps it
    env.engine.store.replace(strip_reserved(ex) | {"updated_at": float("inf")}, if_match=ex["_etag"])
    json_out.echo(detail_json(Admin(env.engine).describe(h.id)))  # what `durable show r --json` prints
    out = capsys.readouterr().out
    try:
        _strict(out)
    except ValueError as exc:
        pytest.fail(
            f"`--json` printed something a JSON parser refuses ({exc}): json_out.echo dumps with "
            "allow_nan=True, so a corrupt non-finite time, which wording.iso passes through unchanged, "
            f"comes out as a bare Infinity/NaN token:\n{out[:400]}"
        )
