"""Breaker tests for dd4abea (a large workflow input is a document of its own, ``in:payload``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from celery_durable import workflow as wf
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.model import INLINE_PAYLOAD
from celery_durable.engine.documents.schema import input_id
from celery_durable.stores import store_from_url
from tests.engine.inprocess import InProcess

BIG = "x" * (2 * INLINE_PAYLOAD)


def test_describe_around_an_undecodable_step_still_shows_a_large_input(tmp_path: Path) -> None:
    """``Admin.describe`` of a partition holding one undecodable document reads the documents the
    exec implies one by one (engine/admin/undecodable.py ``salvage``). It reads the current run's
    markers, outcomes, wait decisions and signal values, but not the input document the exec
    names in ``payload_at``. So an execution with a large input shows ``payload=None`` in
    describe / ``durable show`` once any of its steps is undecodable, while the same execution
    with a small (inline) input shows its input. The input is still stored; describe should read
    ``payload_at`` too and show it."""
    path = tmp_path / "salvage.db"
    env = InProcess(store_from_url(f"sqlite:///{path}"))

    @env.activity
    def echo(x: str) -> str:
        return x[:4]

    @env.workflow
    def two(data: str) -> list[str]:
        return [echo(data), echo(data)]

    big = env.start(two, BIG)
    small = env.start(two, "tiny")
    assert env.status(big) == env.status(small) == "completed"
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE docs SET body = '{oops' WHERE pk IN (?, ?) AND id = 's:000002'", (big, small))
    admin = Admin(env.engine)
    small_detail = admin.describe(small)
    assert small_detail.corrupt  # read around the undecodable step
    assert small_detail.payload == {"args": ["tiny"], "kwargs": {}}
    big_detail = admin.describe(big)
    assert big_detail.corrupt
    assert env.store.read(big, input_id(0)) is not None  # the input is there
    assert big_detail.payload == {"args": [BIG], "kwargs": {}}


def test_a_fenced_child_revived_by_a_resume_keeps_its_large_input_apart() -> None:
    """A cancelling drive claims the id of a child not created yet with a *fence* (a cancelled
    exec, engine/children/links.py ``fence_children``), built with ``new_exec_doc`` from the
    marker's input and written with ``store.create``, i.e. without ``split_payload``: the large
    input rides inline in the fence's exec. An operator's resume of the parent revives the fence
    into the running child (``_revive``: the fence's body, inline input included), so this child
    carries its large input in its exec and rewrites it with every step, which dd4abea promises
    no execution does (an input over INLINE_PAYLOAD is ``in:payload``, named by ``payload_at``).
    A child created normally with the same input holds it apart; the revived one should too."""
    from tests.engine.inprocess import parent_and_child
    from tests.engine.test_regressions_links import Env

    env = Env()
    ran: list[str] = []
    pdef = parent_and_child(env, ran)
    real_start = env.engine.children.start_child
    env.engine.children.start_child = lambda req: False  # type: ignore[method-assign,assignment,return-value]
    eid = env.start(pdef, BIG, wid="P")  # the worker died before creating the child
    env.engine.children.start_child = real_start  # type: ignore[method-assign]
    env.clock.t += 1.0
    assert env.engine.cancel(eid) is True
    env.worker.run()
    fence = env.store.read("P-c1", "exec")
    assert fence is not None and fence.get("fence")
    Admin(env.engine).resume(eid)
    env.worker.run()
    env.finish(rounds=3, hours=400 / 3600)  # recovery reports the child's end, re-sends what was lost
    assert ran == [BIG]
    assert env.ex(eid)["status"] == "completed"
    child = env.store.read("P-c1", "exec")
    assert child is not None and child["status"] == "completed"
    assert "payload" not in child, "the revived child carries its large input inline in its exec"
    assert child.get("payload_at") == input_id(0)


def _join_race(next_input: str) -> tuple[Any, InProcess, str]:
    """A parent starts child ``K`` (a large input), then starts ``K`` again with the same input:
    the second start joins. Between the joiner's read of K's exec and its read of K's input
    document, K continues as new with ``next_input`` (pruning the input document the joiner was
    about to read), then ends when told."""
    from celery_durable.engine.replay.context import require_context
    from celery_durable.stores.memory import MemoryStore

    store = MemoryStore()
    env = InProcess(store)

    def loop(data: str) -> int:
        if wf.wait_signal("go"):
            wf.continue_as_new(next_input)
        return len(data)

    child_def = env.workflow(loop, signals={"go": int})

    def parent(data: str) -> list[int]:
        ctx = require_context("parent")
        first = ctx.start_child(child_def, (data,), {}, "K")
        again = ctx.start_child(child_def, (data,), {}, "K")  # the same explicit id and input: joins
        return [first.result(), again.result()]

    pdef = env.workflow(parent)
    real_read = store.read
    raced: list[bool] = []

    def racing_read(pk: str, doc_id: str) -> Any:
        if pk == "K" and doc_id == input_id(0) and not raced:
            raced.append(True)  # the joiner read K's exec; K continues as new before its input is read
            env.engine.signal("K", "go", 1)
            env.engine.drive("K")
        return real_read(pk, doc_id)

    store.read = racing_read  # type: ignore[method-assign]
    eid = env.start(pdef, BIG)
    env.finish(rounds=3, hours=400 / 3600)  # recovery reports the child's end, re-sends what was lost
    assert raced
    env.engine.signal("K", "go", 0)
    env.finish(rounds=3, hours=400 / 3600)  # recovery reports the child's end, re-sends what was lost
    return real_read, env, eid


def test_joining_a_child_that_continues_as_new_meanwhile_is_not_refused_for_other_input() -> None:
    """Joining compares the existing child's input with the step's (engine/children/holders.py
    ``joinable``). With the input apart that is two reads: the child's exec, then the input
    document it names. Failed before: if the child continued as new between them, its old run's
    ``in:payload`` was pruned, the second read found nothing and the step was failed for good with
    ``ChildIdTaken`` ("started with other input") although the child continued with the very same
    input. Now the exec is read again and its current input compared, as an inline input is."""
    real_read, env, eid = _join_race(BIG)
    kid = real_read("K", "exec")
    assert kid is not None and kid["run"] == 1 and kid["status"] == "completed"
    assert env.ex(eid)["status"] == "completed", env.ex(eid).get("error")
    assert env.ex(eid)["result"] == [len(BIG), len(BIG)]


def test_a_child_that_continued_with_another_input_is_refused_as_inline_inputs_are() -> None:
    """The same race, the child continuing with another input: the joiner compares the input
    the exec names when read again, so the step is refused (``ChildIdTaken``, other input), as
    it is for an inline input read after the child continued: no input is ever assumed."""
    real_read, env, eid = _join_race(BIG + "changed")
    assert env.ex(eid)["status"] == "failed"
    assert "other input" in str(env.ex(eid).get("error"))
