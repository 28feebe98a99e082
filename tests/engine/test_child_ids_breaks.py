"""Adversarial tests of child ids (celery_durable/engine/children/holders.py, links.py).

Promise (README "Children"; docs/architecture.md §7): a taken child id is joined only by this
parent's child "of the same workflow *and the same input*"; "this parent's child with another
input" fails the step with ChildWorkflowError (ChildIdTaken) — "another input would silently
give the step a result computed from other arguments" (kin.joinable).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_durable import ChildWorkflowError, Durable
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-children", set_as_current=False)
durable = Durable(app, store="memory://")


@durable.workflow(name="adv.children.echo")
def echo(x: Any) -> str:
    return f"{type(x).__name__}:{x!r}"


@durable.workflow(name="adv.children.true_then_one")
def true_then_one() -> list[str]:
    out = [echo.start_child(True, _workflow_id="adv-kid-bool").result()]
    try:
        out.append(echo.start_child(1, _workflow_id="adv-kid-bool").result())
    except ChildWorkflowError as exc:
        out.append(f"refused: {exc.type_name}")
    return out


@durable.workflow(name="adv.children.int_then_float")
def int_then_float() -> list[str]:
    out = [echo.start_child([1, {"a": 2}], _workflow_id="adv-kid-num").result()]
    try:
        out.append(echo.start_child([1.0, {"a": 2.0}], _workflow_id="adv-kid-num").result())
    except ChildWorkflowError as exc:
        out.append(f"refused: {exc.type_name}")
    return out


def test_a_child_id_is_not_joined_with_true_in_place_of_1() -> None:
    """Breaks "joined only with the same input": the input ``1`` joins the child started with
    ``True`` (``True == 1`` in Python's comparison of the recorded payloads), so the step gets
    the result computed from ``True`` ("bool:True") instead of ChildIdTaken."""
    env = WorkflowEnvironment(durable)
    out = env.result(env.start(true_then_one, _workflow_id="adv-parent-bool"))
    assert out[0] == "bool:True"
    assert out[1] == "refused: ChildIdTaken", out


def test_a_child_id_is_joined_with_floats_equal_to_its_ints() -> None:
    """JSON has one number type, and a store such as Cosmos gives ``1.0`` back as ``1``: the
    untyped inputs ``[1.0, {'a': 2.0}]`` and ``[1, {'a': 2}]`` are the same input (unlike ``True``
    and ``1``, above), so the second step joins the first child (the adversarial review
    asked for a refusal; kept as the documented rule instead, README "Limitations")."""
    env = WorkflowEnvironment(durable)
    out = env.result(env.start(int_then_float, _workflow_id="adv-parent-num"))
    assert out[1] == out[0], out
