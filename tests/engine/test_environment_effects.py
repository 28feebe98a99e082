"""``WorkflowEnvironment`` runs the effects a workflow emits, as workers do (the engine owns the outbox)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from pydantic import BaseModel

from celery_durable import Durable
from celery_durable import workflow as wf
from celery_durable.retry import RetryPolicy
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("env-effects-tests", set_as_current=False)
durable = Durable(app, store="memory://")
SENT: list[str] = []
FLAKY: list[int] = []


class Mail(BaseModel):
    to: str


@durable.effect("env.mail")
def send_mail(mail: Mail) -> None:
    SENT.append(mail.to)


@durable.effect("env.flaky", retry=RetryPolicy(initial_interval=timedelta(seconds=5), maximum_attempts=3))
def flaky(mail: Mail) -> None:
    FLAKY.append(len(FLAKY))
    if len(FLAKY) < 3:
        raise ConnectionError("smtp down")


@durable.workflow(name="env.notify")
def notify(to: str) -> str:
    first = wf.emit("env.mail", Mail(to=to))
    wf.sleep(timedelta(hours=1))
    wf.emit("env.mail", Mail(to=to + "+later"), key=to)
    return first


@durable.workflow(name="env.flaky_notify")
def flaky_notify(to: str) -> str:
    return wf.emit("env.flaky", Mail(to=to))


def test_emitted_effects_run_in_the_environment() -> None:
    SENT.clear()
    env = WorkflowEnvironment(durable)
    h = env.start(notify, "ann", _workflow_id="n-1")
    assert SENT == ["ann"]  # run right after the drive that recorded it
    assert env.result(h) == "n-1:000001"
    assert SENT == ["ann", "ann+later"]
    info = env.engine.outbox.get("n-1:000001")
    assert info is not None and info["status"] == "succeeded"


def test_effect_retries_follow_their_policy_on_the_fake_clock() -> None:
    FLAKY.clear()
    env = WorkflowEnvironment(durable)
    h = env.start(flaky_notify, "bob", _workflow_id="f-1")
    assert env.result(h) == "f-1:000001"
    assert FLAKY == [0]  # failed once; the retry waits for its backoff
    env.advance(timedelta(seconds=5.5))
    assert FLAKY == [0, 1]
    env.advance(timedelta(seconds=60))
    assert FLAKY == [0, 1, 2]
    row = env.engine.outbox.get("f-1:000001")
    assert row is not None and row["status"] == "succeeded" and row["attempt"] == 3
