"""``@shared_workflow`` (issue 25): a workflow declared in a reusable (Django) app, without the
project's ``Durable`` at hand, as Celery's ``@shared_task``: every Durable's registry knows it,
``start()`` goes through the current app's Durable, and children and replays find it."""

from __future__ import annotations

import pytest
from celery import Celery, current_app

from celery_durable import ConfigurationError, Durable, durable_activity, shared_workflow
from celery_durable import workflow as wf
from celery_durable.testing.env import WorkflowEnvironment


@durable_activity(name="reuse.shout")
def shout(text: str) -> str:
    return text.upper()


@shared_workflow(name="reuse.greet", signals={"name": str})
def greet(greeting: str) -> str:
    """Declared in the reusable app: no Durable imported."""
    return f"{shout(greeting)}, {wf.wait_signal('name')}"


@shared_workflow
def twice(greeting: str) -> list[str]:
    return [greet.start_child(greeting).result(), greet.start_child(greeting + "!").result()]


def test_every_durable_runs_a_shared_workflow_and_its_children() -> None:
    for n in range(2):  # two projects (apps) in one process: both know it
        durable = Durable(Celery(f"project-{n}", set_as_current=False), store="memory://")
        env = WorkflowEnvironment(durable)
        h = env.start(greet, "hello")
        env.signal(h, "name", "ada")
        assert env.result(h) == "HELLO, ada"
        assert durable.registry.workflow("reuse.greet") is greet.definition
        assert "reuse.greet" in durable.registry.workflow_names()
        parent = env.start(twice, "hi")
        kids = [f"{parent.id}-c1", f"{parent.id}-c2"]
        env.signal(env.handle(kids[0]), "name", "bo")
        env.signal(env.handle(kids[1]), "name", "cy")
        assert env.result(parent) == ["HI, bo", "HI!, cy"]


def test_start_goes_through_the_current_apps_durable() -> None:
    before = current_app._get_current_object()
    app = Celery("project-current", set_as_current=False)
    durable = Durable(app, store="memory://")
    try:
        app.set_current()  # as in a worker, or a Django process that imported proj.celery
        assert greet._durable is durable
        Celery("no-durable", set_as_current=True)
        with pytest.raises(ConfigurationError, match="'no-durable' has no Durable"):
            greet.start("hello")
    finally:
        before.set_current()


def test_a_shared_name_cannot_be_taken_twice() -> None:
    with pytest.raises(ConfigurationError, match="two shared workflows are named 'reuse.greet'"):

        @shared_workflow(name="reuse.greet")
        def other(greeting: str) -> str:
            return greeting

    durable = Durable(Celery("project-clash", set_as_current=False), store="memory://")
    with pytest.raises(ConfigurationError, match="two workflows are named 'reuse.greet'"):

        @durable.workflow(name="reuse.greet")
        def local(greeting: str) -> str:
            return greeting
