"""Versioning with ``wf.patched`` / ``wf.deprecate_patch`` (issue 13, item 2), in-process: executions
suspended on one version of the code are driven on by the next (one store, two environments
whose registries hold different code under one workflow name). The same with real workers:
tests/integration/test_patching.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_durable import NonDeterminismError, WorkflowFailedError, durable_activity
from celery_durable import workflow as wf
from celery_durable.engine.registry import Registry
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment

NAME = "pt.flow"
ran: list[str] = []


@durable_activity(name="pt.reserve")
def reserve(x: str) -> str:
    ran.append(f"reserve {x}")
    return f"r-{x}"


@durable_activity(name="pt.audit")
def audit(x: str) -> str:
    ran.append(f"audit {x}")
    return f"a-{x}"


def v1(x: str) -> str:
    r = reserve(x)
    go = wf.wait_signal("go")
    return f"{r}|{go}"


def v2(x: str) -> str:
    r = reserve(x)
    if wf.patched("add-audit"):
        r += "+" + audit(x)
    go = wf.wait_signal("go")
    return f"{r}|{go}"


def v3_unpatched(x: str) -> str:
    r = reserve(x)
    r += "+" + audit(x)
    go = wf.wait_signal("go")
    return f"{r}|{go}"


def v4_deprecated(x: str) -> str:
    r = reserve(x)
    wf.deprecate_patch("add-audit")
    r += "+" + audit(x)
    go = wf.wait_signal("go")
    return f"{r}|{go}"


class Deploy:
    """One store; each ``on(code)`` is a new deployment (a fresh environment) of ``pt.flow``."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.env: WorkflowEnvironment | None = None

    def on(self, fn: Callable[..., Any]) -> WorkflowEnvironment:
        registry = Registry()
        registry.add_workflow(NAME, fn)
        start = self.env.clock.t if self.env is not None else None
        self.env = WorkflowEnvironment(registry, store=self.store, start=start)
        return self.env

    def start(self, x: str) -> str:
        assert self.env is not None
        eid, _ = self.env.engine.start(self.env.engine.registry.workflows[NAME], (x,), {}, workflow_id=x)
        self.env.run_until_idle()
        return eid

    def finish(self, eid: str) -> Any:
        assert self.env is not None
        self.env.signal(eid, "go", "go")
        return self.env.handle(eid).result(timeout=0)

    def kinds(self, eid: str) -> list[tuple[str, str]]:
        markers = [d for d in self.store.query_partition(eid).docs if d.get("type") == "step"]
        return [(d["kind"], d["name"]) for d in sorted(markers, key=lambda d: d["seq"])]


def test_patched_lets_old_executions_take_the_old_branch_and_new_ones_the_new() -> None:
    d = Deploy()
    d.on(v1)
    old = d.start("old")
    assert d.kinds(old) == [("activity", "pt.reserve"), ("signal", "go")]
    d.on(v2)  # deployed while "old" waits for its signal
    new = d.start("new")
    assert d.finish(old) == "r-old|go"  # the old branch: no audit
    assert d.finish(new) == "r-new+a-new|go"
    # an old history keeps its step numbers: no marker was inserted into it
    assert d.kinds(old) == [("activity", "pt.reserve"), ("signal", "go")]
    assert d.kinds(new) == [
        ("activity", "pt.reserve"),
        ("patch", "add-audit"),
        ("activity", "pt.audit"),
        ("signal", "go"),
    ]
    assert "audit old" not in ran and "audit new" in ran


def test_an_old_execution_reaching_the_patch_point_after_the_deploy_takes_the_new_branch() -> None:
    d = Deploy()
    d.on(v1)
    eid, _ = d.env.engine.start(d.env.engine.registry.workflows[NAME], ("edge",), {}, workflow_id="edge")  # type: ignore[union-attr]
    d.on(v2)  # the first drive runs on v2: nothing recorded past the patch point
    d.env.run_until_idle()  # type: ignore[union-attr]
    assert d.finish(eid) == "r-edge+a-edge|go"


def test_code_changed_without_patched_fails_naming_the_step_and_both_calls() -> None:
    d = Deploy()
    d.on(v1)
    old = d.start("v1-then-v3")
    d.on(v3_unpatched)
    with pytest.raises(WorkflowFailedError) as failed:
        d.finish(old)
    assert failed.value.type_name == NonDeterminismError.__name__
    assert "step 2: the history has signal 'go' but the code now calls activity 'pt.audit'" in failed.value.message


def test_deprecate_patch_accepts_histories_with_the_marker_and_records_none() -> None:
    d = Deploy()
    d.on(v2)
    marked = d.start("marked")
    d.on(v4_deprecated)
    fresh = d.start("fresh")
    assert d.finish(marked) == "r-marked+a-marked|go"
    assert d.finish(fresh) == "r-fresh+a-fresh|go"
    assert ("patch", "add-audit") not in d.kinds(fresh)
    # once deprecate_patch is removed too, executions it started replay unchanged ...
    again = d.start("again")
    d.on(v3_unpatched)
    assert d.finish(again) == "r-again+a-again|go"
    # ... and one that still holds the marker fails, and the error says what to keep
    d.on(v2)
    held = d.start("held")
    d.on(v3_unpatched)
    with pytest.raises(WorkflowFailedError, match=r"step 2: the history has patch 'add-audit'.*deprecate_patch"):
        d.finish(held)


def test_a_change_id_keeps_its_first_answer_and_patches_stack() -> None:
    def v1_loop(n: int) -> list[str]:
        out = [reserve(str(i)) for i in range(n)]
        wf.wait_signal("go")
        return out

    def v2_loop(n: int) -> list[str]:
        out = []
        for i in range(n):
            if wf.patched("loop-audit"):  # asked n times: one marker, one answer
                out.append(audit(str(i)))
            out.append(reserve(str(i)))
        if wf.patched("second"):
            out.append("second")
        wf.wait_signal("go")
        return out

    d = Deploy()
    reg = Registry()
    for name, fn in (("old", v1_loop), ("new", v2_loop)):
        reg = Registry()
        reg.add_workflow(NAME, fn)
        d.env = WorkflowEnvironment(reg, store=d.store, start=d.env.clock.t if d.env else None)
        d.env.engine.start(reg.workflows[NAME], (2,), {}, workflow_id=f"loop-{name}")
        d.env.run_until_idle()
    assert d.finish("loop-old") == ["r-0", "r-1"]
    assert d.finish("loop-new") == ["a-0", "r-0", "a-1", "r-1", "second"]
    assert [k for k in d.kinds("loop-new") if k[0] == "patch"] == [("patch", "loop-audit"), ("patch", "second")]


def test_patch_ids_are_checked_and_patched_is_refused_outside_a_workflow() -> None:
    with pytest.raises(RuntimeError, match="inside a workflow"):
        wf.patched("x")

    def bad(x: str) -> str:
        wf.patched("")
        return x

    d = Deploy()
    d.on(bad)
    eid = d.start("bad")
    info = d.env.handle(eid).poll()  # type: ignore[union-attr]
    assert info.status == "failed" and info.error is not None and "non-empty string" in info.error["message"]


def test_a_query_replays_a_patched_history() -> None:
    def v2_query(x: str) -> str:
        path = ["reserve"]
        wf.set_query_handler("path", lambda: path)
        reserve(x)
        if wf.patched("add-audit"):
            audit(x)
            path.append("audit")
        go = wf.wait_signal("go")
        return go

    d = Deploy()
    d.on(v1)
    old = d.start("q-old")
    d.on(v2_query)
    new = d.start("q-new")
    assert d.env.handle(old).query("path") == ["reserve"]  # type: ignore[union-attr]
    assert d.env.handle(new).query("path") == ["reserve", "audit"]  # type: ignore[union-attr]
