"""Breakers: the parent/child tree (celery_durable/engine/admin/family.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_durable.stores.base import strip_reserved
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.ui import flows
from tests.ui.conftest import page_as_operator


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    return WorkflowEnvironment(flows.durable, store=SqliteStore(str(tmp_path / "f.db")))


def test_a_malformed_child_step_of_a_grandchild_partition_does_not_take_the_parents_page_down(
    env: WorkflowEnvironment,
) -> None:
    env.start(flows.brood, 1, 2, _workflow_id="t")  # t -> t-0 -> t-0-0
    store = env.engine.store
    (child_marker,) = [d for d in store.query_partition("t-0").docs if d.get("kind") == "child"]
    # one of t-0's child step markers has a seq of the wrong type (a partial write, a bad migration)
    store.replace(strip_reserved(child_marker) | {"seq": "one"}, if_match=child_marker["_etag"])
    r = page_as_operator(env.engine, "/executions/t")
    assert r.status_code == 200, (
        f"the root's page is a {r.status_code} because one step marker in a descendant's partition is "
        "malformed: family._children sorts by int(d.get('seq')) outside any error handling; the tree "
        "promises to show a member it cannot read as missing, not to fail the page"
    )
