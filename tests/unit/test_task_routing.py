"""Issue 25: Celery 5.7 deprecates routing options set as task attributes (``queue``,
``routing_key``…, removed in 6.0: celery#10453). The library's own tasks carry none: they are
routed by ``task_routes`` like any task (docs/concepts.md), and binding them warns nothing."""

from __future__ import annotations

import warnings

from celery import Celery

from celery_durable import Durable, durable_activity


def _binding_warnings(app: Celery) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app.finalize(auto=True)
        for task in app.tasks.values():
            task.bind(app)  # idempotent; warns once per class if it sets a routing attribute
    return [str(w.message) for w in caught if "task attribute" in str(w.message)]


def test_binding_the_library_tasks_warns_nothing() -> None:
    app = Celery("routing-tests", set_as_current=False, broker="memory://")
    durable = Durable(app, store="memory://")

    @durable_activity(name="routing.step", app=app)
    def step(x: int) -> int:
        return x

    @durable.workflow(name="routing.flow")
    def flow(x: int) -> int:
        return step(x)

    assert _binding_warnings(app) == []
    assert "routing.step" in app.tasks and "celery_durable.drive" in app.tasks


def test_the_check_sees_a_queue_task_attribute() -> None:
    """The check above can fail: a task declared with ``queue=`` warns (Celery 5.7)."""
    app = Celery("routing-tests-neg", set_as_current=False, broker="memory://")

    @app.task(name="routing.old_style", queue="elsewhere", shared=False)
    def old_style() -> None: ...

    assert any("'queue' task attribute" in w for w in _binding_warnings(app))


def test_an_activity_routed_by_task_routes_goes_to_its_queue() -> None:
    app = Celery("routing-tests-2", set_as_current=False, broker="memory://")
    app.conf.task_routes = {"routing.ship": {"queue": "shipping"}}
    Durable(app, store="memory://")

    @durable_activity(name="routing.ship", app=app)
    def ship(x: int) -> int:
        return x

    route = app.amqp.router.route({}, "routing.ship", (1,), {}, task_type=app.tasks["routing.ship"])
    assert route["queue"].name == "shipping"
