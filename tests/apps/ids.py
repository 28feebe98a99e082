"""A Celery app for the workflow-id tests: ``celery -A tests.apps.ids worker``.

Children started under one explicit id twice (joined or refused) and a parent whose default
child id cannot be squatted. Configured from the environment like ``tests.apps.basic``.
"""

from __future__ import annotations

from celery_durable import ChildWorkflowError, Durable
from celery_durable import workflow as wf
from tests.apps._common import env_app

app = env_app("ids")
durable = Durable(app)


@durable.workflow(name="ids.child")
def child(x: str) -> str:
    return x


@durable.workflow(name="ids.held", signals={"go": str})
def held(tag: str) -> str:
    return tag + str(wf.wait_signal("go"))


@durable.workflow(name="ids.parent")
def parent() -> str:
    return child.start_child("default").result()


@durable.workflow(name="ids.twice")
def twice(child_id: str, first: str, second: str) -> str:
    a = child.start_child(first, _workflow_id=child_id).result()
    try:
        b = child.start_child(second, _workflow_id=child_id).result()
    except ChildWorkflowError as exc:
        return f"refused: {exc.type_name}"
    return a + b


@durable.workflow(name="ids.both")
def both(child_id: str) -> str:
    """Two steps on one explicit id in one drive: the second joins the running first."""
    f1 = held.start_child("t", _workflow_id=child_id)
    f2 = held.start_child("t", _workflow_id=child_id)
    return f1.result() + "|" + f2.result()
