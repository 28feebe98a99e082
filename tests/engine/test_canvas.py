"""A Celery canvas run durably (issue 27 §5, glue/canvas.py): ``durable.run(sig)``. Celery's own
canvas tests (t/integration/test_canvas.py: chain, group and chord results) where they map, with
the tasks as durable activities; a chord whose header fails ends failed with its errback run —
never hangs (celery#3146, #4401); the tasks not durable activities are refused at ``run()``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain, chord, group

from celery_durable import Durable, durable_activity
from celery_durable.errors import ConfigurationError, WorkflowFailedError
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("canvas-tests", set_as_current=False)
durable = Durable(app, store="memory://")
CALLS: list[Any] = []


@durable_activity(name="cv.add")
def add(x: int, y: int) -> int:
    CALLS.append(("add", x, y))
    return x + y


@durable_activity(name="cv.xsum")
def xsum(numbers: list[int]) -> int:
    return sum(numbers)


@durable_activity(name="cv.identity")
def identity(x: Any) -> Any:
    return x


@durable_activity(name="cv.fail")
def fail(*args: Any) -> None:
    raise ValueError(f"failed with {args}")


@durable_activity(name="cv.note")
def note(what: str) -> str:
    CALLS.append(("note", what))
    return what


@app.task(name="cv.plain")
def plain(x: int) -> int:
    return x


def _run(sig: Any) -> Any:
    CALLS.clear()
    env = WorkflowEnvironment(durable)
    from celery_durable.glue.canvas import CANVAS_WORKFLOW, check_canvas

    definition = env.engine.registry.workflow(CANVAS_WORKFLOW)
    assert definition is not None
    eid, _ = env.engine.start(definition, (check_canvas(sig, env.engine.registry),), {})
    env.run_until_idle()
    ex = env.engine.read_exec(eid)
    if ex["status"] != "completed":
        raise WorkflowFailedError(
            eid, str((ex.get("error") or {}).get("type")), str((ex.get("error") or {}).get("message"))
        )
    return ex["result"]


def test_simple_chain() -> None:  # celery: test_simple_chain
    assert _run(add.s(4, 4) | add.s(8) | add.s(16)) == 32


def test_chain_with_immutable_and_link() -> None:
    sig = add.s(1, 1)
    sig.link(note.si("linked"))
    assert _run(chain(sig, add.si(10, 10), add.s(1))) == 21
    assert ("note", "linked") in CALLS


def test_group_results_in_order() -> None:  # celery: test_group_results / parallel_chords
    assert _run(group(add.s(i, i) for i in range(10))) == [i + i for i in range(10)]


def test_chord_simple() -> None:  # celery: test_simple_chord
    assert _run(chord((add.s(i, i) for i in range(10)), xsum.s())) == 90


def test_chain_group_chain_is_a_chord_and_nested_members_run_as_children() -> None:  # celery: test_chain_to_a_chord...
    canvas = chain(add.s(1, 1), group(add.s(1), add.s(2) | add.s(10)), xsum.s())
    assert _run(canvas) == (2 + 1) + (2 + 2 + 10)


def test_nested_group_chain() -> None:  # celery: test_nested_group_chain
    canvas = chain(add.si(1, 0), group(add.si(1, 100), chain(add.si(1, 200), group(add.si(1, 1000), add.si(1, 2000)))))
    assert _run(canvas) == [101, [1001, 2001]]


def test_chord_header_failure_fails_without_hanging_and_runs_the_errback() -> None:
    """celery#3146, #4401: a chord whose header task fails ends — failed, its errback run, its body
    never run — instead of waiting for a counter that never completes."""
    failing = fail.s()
    failing.link_error(note.si("compensated"))
    with pytest.raises(WorkflowFailedError, match="ValueError"):
        _run(chord([add.s(1, 1), failing, add.s(2, 2)], xsum.s()))
    assert ("note", "compensated") in CALLS
    assert ("add", 1, 1) in CALLS and ("add", 2, 2) in CALLS  # the others ran to their end


def test_tasks_that_are_not_durable_activities_are_refused_at_run() -> None:
    with pytest.raises(ConfigurationError, match="cv.plain"):
        durable.run(chain(add.s(1, 1), plain.s()))
    with pytest.raises(ConfigurationError, match="not a durable activity"):
        durable.run(group(identity.s(1), plain.s(2)))
