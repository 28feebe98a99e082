"""Issue 25: the parent/child tree (bounded: capped nodes and depth, said, never silent) and
what a waited-on activity is doing (queued, running, backing off) as the list shows it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.engine.admin import family as family_mod
from celery_durable.engine.admin.family import family
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.timeline import ExecutionSummary
from celery_durable.engine.admin.waiting import activity_states
from celery_durable.engine.documents.schema import marker_id
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.ui import flows


def _tree(client: TestClient, execution_id: str) -> list[tuple[str, str, str]]:
    html = client.get(f"/executions/{execution_id}").text
    return re.findall(
        r'<li class="member d(\d+)[^"]*" data-id="([^"]*)" data-depth="\d+"(?: data-status="(\w+)")?', html
    )


def test_the_tree_shows_parents_above_and_children_below(env: WorkflowEnvironment, client: TestClient) -> None:
    env.start(flows.brood, 2, 2, _workflow_id="b")
    tree = _tree(client, "b-1")
    assert tree == [
        ("0", "b", "running"),
        ("1", "b-1", "running"),
        ("2", "b-1-0", "running"),
        ("2", "b-1-1", "running"),
    ]
    assert 'class="member d1 current"' in client.get("/executions/b-1").text
    whole = [(d, i) for d, i, _ in _tree(client, "b")]
    assert whole == [
        ("0", "b"),
        ("1", "b-0"),
        ("2", "b-0-0"),
        ("2", "b-0-1"),
        ("1", "b-1"),
        ("2", "b-1-0"),
        ("2", "b-1-1"),
    ]
    # an execution with no parent and no children reads nothing more and shows no tree
    env.start(flows.echo, "alone", _workflow_id="alone")
    assert 'id="family"' not in client.get("/executions/alone").text


def test_the_tree_is_capped_and_says_what_it_left_out(
    env: WorkflowEnvironment, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.start(flows.brood, 5, 1, _workflow_id="wide")
    monkeypatch.setattr(family_mod, "MAX_NODES", 3)
    members = _family(env, "wide")
    assert [m.id for m in members] == ["wide", "wide-0", "wide-1", "wide-2", ""]
    assert members[-1].more == 2
    assert "… 2 more not shown" in client.get("/executions/wide").text

    env.start(flows.brood, 1, 5, _workflow_id="deep")
    monkeypatch.setattr(family_mod, "MAX_NODES", 50)
    tree = _family(env, "deep")
    # three levels below, the last one says it has a child of its own not shown
    assert [(m.id, m.depth, m.more) for m in tree] == [
        ("deep", 0, 0),
        ("deep-0", 1, 0),
        ("deep-0-0", 2, 0),
        ("deep-0-0-0", 3, 1),
    ]
    # from the bottom: every parent up to the root (MAX_UP), the top one first
    leaf = "deep-0-0-0-0-0"
    up = _family(env, leaf, ())
    assert [m.id for m in up] == ["deep", "deep-0", "deep-0-0", "deep-0-0-0", "deep-0-0-0-0", leaf]
    monkeypatch.setattr(family_mod, "MAX_UP", 2)
    up = _family(env, leaf, ())
    assert [m.id for m in up] == ["deep-0-0-0", "deep-0-0-0-0", leaf] and up[0].more == 1


def test_a_purged_member_is_shown_as_missing(env: WorkflowEnvironment, client: TestClient) -> None:
    env.start(flows.brood, 1, 1, _workflow_id="p")
    env.engine.store.delete("p-0", "exec")
    tree = _family(env, "p")
    assert [(m.id, m.missing) for m in tree] == [("p", None), ("p-0", "not found (purged?)")]
    assert "not found (purged?)" in client.get("/executions/p").text


def _family(env: WorkflowEnvironment, eid: str, children: tuple[str, ...] | None = None) -> list[Any]:
    detail = Admin(env.engine).describe(eid)
    return family(env.engine.store, detail.summary, detail.children if children is None else children)


def _summary(eid: str, *waiting: dict[str, Any]) -> ExecutionSummary:
    return ExecutionSummary(id=eid, workflow="w", status="running", run=0, waiting=tuple(waiting))


def test_a_waited_on_activity_is_queued_running_or_backing_off() -> None:
    store, now = MemoryStore(), 1_000.0
    marker = {"type": "step", "kind": "activity", "name": "a", "seq": 1, "run": 0, "pk": "e"}
    cases = {
        "queued": {},
        "running": {"lease": {"holder": "w1", "expires": now + 30}, "attempts": 2, "started_at": now - 1},
        "lapsed": {"lease": {"holder": "w1", "expires": now - 1}, "attempts": 1},
        "backoff": {"attempts": 1, "last_error": {"type": "E"}, "failed_at": now - 5, "retry_at": now + 60},
        "due": {"attempts": 1, "last_error": {"type": "E"}, "failed_at": now - 90, "retry_at": now - 30},
    }
    rows = []
    for eid, fields in cases.items():
        store.create(marker | {"pk": eid, "id": marker_id(1, 0)} | fields)
        rows.append(
            _summary(eid, {"seq": 1, "kind": "activity", "name": "a"}, {"seq": 2, "kind": "timer", "until": 5.0})
        )
    rows.append(_summary("sleeping", {"seq": 1, "kind": "timer", "until": 5.0}))
    got = activity_states(store, rows, now)
    states = {eid: (items[0].get("state"), items[0].get("attempt")) for eid, items in got.items()}
    assert states == {
        "queued": ("queued", None),
        "running": ("running", 2),
        "lapsed": ("queued", 1),  # its worker died: the lease lapsed, recovery sends it again
        "backoff": ("backoff", 1),
        "due": ("queued", 1),  # the backoff is over: the retry waits for a worker
    }
    assert got["backoff"][0]["retry_at"] == now + 60
    assert all(items[1] == {"seq": 2, "kind": "timer", "until": 5.0} for items in got.values())  # left as it was
    assert "sleeping" not in got  # nothing read for an execution that waits on no activity


def test_the_lists_live_refresh_reads_no_counts(env: WorkflowEnvironment, client: TestClient) -> None:
    """The page polls itself every 5 s with ``live=1``: its rows again, not the status counts
    (up to 200 exec documents a status: a cost per poll the header does not need)."""
    env.start(flows.echo, "x", _workflow_id="x")
    full = client.get("/executions").text
    live = client.get("/executions", params={"live": "1"}).text
    assert 'id="counts"' in full and 'id="counts"' not in live
    assert 'id="list-live"' in live and 'data-id="x"' in live
