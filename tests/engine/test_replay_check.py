"""The replay check (issue 27 §3, engine/replay/check.py): recorded histories replayed read-only
against other code — compatible, or the first step where the code leaves the history with both
calls; an ended execution given a step it never took; code that returns early; code that now
fails; an unregistered workflow; a corrupt document; ``wf.patched`` making a change compatible;
an exported history checked as the live one is."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.registry import Registry
from celery_durable.engine.replay.check import Verdict, check_history, docs_of, export_history
from celery_durable.settings import Settings
from tests.engine.inprocess import InProcess

ACTIVITIES = ("a", "b", "c")


def _world() -> tuple[InProcess, dict[str, Callable[..., Any]]]:
    w = InProcess()
    calls = {name: w.activity(_named(name)) for name in ACTIVITIES}
    return w, calls


def _named(name: str) -> Callable[..., Any]:
    def fn(x: int) -> str:
        return f"{name}{x}"

    fn.__name__ = name
    return fn


def _v1(calls: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    def order(x: int) -> str:
        first = calls["a"](x)
        wf.wait_signal("go")
        return first + calls["b"](x)

    return order


def _registry(w: InProcess, fn: Callable[..., Any]) -> Registry:
    """Another deploy's code: the same activities, ``fn`` as workflow ``order``."""
    reg = Registry()
    for name in ACTIVITIES:
        act = w.registry.activity(name)
        assert act is not None
        reg.activities[name] = act
    reg.add_workflow("order", fn)
    return reg


def _check(w: InProcess, eid: str, reg: Registry) -> Any:
    docs = {d["id"]: d for d in w.store.query_partition(eid).docs}
    return check_history(docs, reg, Settings(), w.clock.now())


def _started(finished: bool = False) -> tuple[InProcess, dict[str, Callable[..., Any]]]:
    w, calls = _world()
    w.registry.add_workflow("order", _v1(calls))
    w.engine.start(w.registry.workflows["order"], (1,), {}, workflow_id="o1")
    w.run()
    assert w.status("o1") == "running"
    if finished:
        w.engine.signal("o1", "go", 1)
        w.run()
        assert w.status("o1") == "completed"
    return w, calls


def test_the_same_code_and_code_going_further_are_compatible() -> None:
    w, calls = _started()
    assert _check(w, "o1", _registry(w, _v1(calls))).verdict == Verdict.COMPATIBLE

    def more(x: int) -> str:  # the same recorded steps, then more after the wait: fine for a running one
        first = calls["a"](x)
        wf.wait_signal("go")
        return first + calls["b"](x) + calls["c"](x)

    v = _check(w, "o1", _registry(w, more))
    assert v.ok and v.step is None and v.hint is None


def test_another_step_where_the_history_has_one_is_incompatible_with_both_calls() -> None:
    w, calls = _started()

    def changed(x: int) -> str:
        first = calls["c"](x)  # was a
        wf.wait_signal("go")
        return first

    v = _check(w, "o1", _registry(w, changed))
    assert v.verdict == Verdict.INCOMPATIBLE and v.step == 1
    assert v.history == "activity 'a'" and v.code == "activity 'c'"
    assert v.hint is not None and "patched" in v.hint and "step 1" in v.hint


def test_the_change_behind_patched_is_compatible() -> None:
    w, calls = _started()

    def patched(x: int) -> str:
        first = calls["c"](x) if wf.patched("use-c") else calls["a"](x)
        wf.wait_signal("go")
        return first

    assert _check(w, "o1", _registry(w, patched)).verdict == Verdict.COMPATIBLE


def test_an_ended_execution_given_a_step_it_never_took_is_incompatible() -> None:
    w, calls = _started(finished=True)

    def longer(x: int) -> str:
        first = calls["a"](x)
        wf.wait_signal("go")
        second = calls["b"](x)
        return first + second + calls["c"](x)  # step 4: the completed execution ended before it

    v = _check(w, "o1", _registry(w, longer))
    assert v.verdict == Verdict.INCOMPATIBLE and v.step == 4 and v.code == "activity 'c'"
    assert _check(w, "o1", _registry(w, _v1(calls))).ok


def test_code_that_returns_before_the_recorded_steps_end_is_incompatible() -> None:
    w, calls = _started(finished=True)

    def shorter(x: int) -> str:
        return str(calls["a"](x))

    v = _check(w, "o1", _registry(w, shorter))
    assert v.verdict == Verdict.INCOMPATIBLE and v.step == 2 and v.code == "returns"


def test_code_that_now_raises_fails() -> None:
    w, calls = _started()

    def broken(x: int) -> str:
        calls["a"](x)
        raise RuntimeError("a bug in the new code")

    v = _check(w, "o1", _registry(w, broken))
    assert v.verdict == Verdict.FAILS and "a bug in the new code" in v.detail


def test_an_unregistered_workflow_and_a_corrupt_document() -> None:
    w, _ = _started()
    v = _check(w, "o1", Registry())
    assert v.verdict == Verdict.UNKNOWN and "order" in v.detail
    docs = {d["id"]: d for d in w.store.query_partition("o1").docs}
    marker = next(d for d in docs.values() if d.get("type") == "step")
    docs[marker["id"]] = dict(marker, seq="not a number")
    bad = check_history(docs, w.registry, Settings(), w.clock.now())
    assert bad.verdict == Verdict.UNREADABLE


def test_an_exported_history_checks_as_the_live_one() -> None:
    w, calls = _started()
    docs = {d["id"]: d for d in w.store.query_partition("o1").docs}
    exported = json.loads(json.dumps(export_history(docs)))

    def changed(x: int) -> str:
        return str(calls["b"](x))

    for code, expected in ((_v1(calls), Verdict.COMPATIBLE), (changed, Verdict.INCOMPATIBLE)):
        reg = _registry(w, code)
        assert check_history(docs_of(exported), reg, Settings(), 0.0).verdict == expected
        assert _check(w, "o1", reg).verdict == expected


def test_the_pytest_helper_takes_one_history_and_refuses_none() -> None:
    """A single export (not a list of them) is one history; an empty selection — a mistyped
    glob — is an error, not a pass."""
    from celery import Celery

    from celery_durable import Durable
    from celery_durable.testing.replay import replay

    w, calls = _started()
    docs = {d["id"]: d for d in w.store.query_partition("o1").docs}
    durable = Durable(Celery("rc-helper", set_as_current=False), store="memory://")
    durable.registry.activities.update(_registry(w, _v1(calls)).activities)
    durable.registry.add_workflow("order", _v1(calls))
    (v,) = replay(durable, export_history(docs))
    assert v.ok
    import pytest

    with pytest.raises(ValueError, match="no history"):
        replay(durable, [])
