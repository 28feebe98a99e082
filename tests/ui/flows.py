"""Workflows for the UI tests (in-process, on ``WorkflowEnvironment``)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf

app = Celery("ui-tests", set_as_current=False)
durable = Durable(app, store="memory://")
MAILS: list[str] = []
FLAKY: list[int] = []


@durable_activity(name="ui.add")
def add(a: int, b: int) -> int:
    return a + b


@durable_activity(name="ui.wobbly", autoretry_for=(ConnectionError,), max_retries=5, default_retry_delay=0)
def wobbly(key: str) -> str:
    FLAKY.append(1)
    if len(FLAKY) < 3:
        raise ConnectionError(f"attempt {len(FLAKY)} failed")
    return f"ok after {len(FLAKY)}"


@durable_activity(name="ui.refuses")
def refuses(why: str) -> str:
    raise NonRetryableError(why)


@durable.effect("ui.mail")
def mail(to: str) -> None:
    MAILS.append(to)


@durable.effect("ui.bounce", max_attempts=1)
def bounce(to: str) -> None:
    raise ConnectionRefusedError(f"mailbox {to} is full")


@durable.workflow(name="ui.echo")
def echo(text: str) -> str:
    return text


@durable.workflow(name="ui.kid")
def kid(n: int) -> int:
    return add(n, 1)


@durable.workflow(name="ui.order", signals={"approve": bool})
def order(item: str) -> dict[str, object]:
    """Activities (one retried), an effect, a timer, a child, then a wait for a signal."""
    total = add(1, 2)
    retried = wobbly(item)
    wf.emit("ui.mail", f"{item}@example.com", key=f"mail-{item}")
    wf.sleep(timedelta(minutes=5))
    child = kid.start_child(total, _workflow_id=f"{wf.execution_id()}-kid").result()
    approved = wf.wait_signal("approve", timeout=timedelta(days=1))
    return {"total": total, "retried": retried, "child": child, "approved": approved}


@durable.workflow(name="ui.fails")
def fails(why: str) -> str:
    return refuses(why)


@durable.workflow(name="ui.counts")
def counts() -> int:
    """Declares no signals: a value is typed where it is consumed (a bad one is rejected)."""
    return int(wf.wait_signal("n", int))


REFUNDS: list[str] = []
LABEL_BROKEN = [True]


@durable_activity(name="ui.refund")
def refund(order: str) -> str:
    REFUNDS.append(order)
    return f"refunded {order}"


@durable_activity(name="ui.label")
def label(order: str) -> str:
    if LABEL_BROKEN[0]:
        raise NonRetryableError("printer out of paper")
    return f"LBL-{order}"


@durable.workflow(name="ui.saga")
def saga(order: str) -> str:
    """A charge, its refund registered, a label that fails while the printer is broken."""
    with wf.Saga() as s:
        add(1, 1)
        s.add(refund, order)
        return label(order)


@durable.workflow(name="ui.brood")
def brood(n: int, depth: int) -> int:
    """``n`` children (``<id>-<i>``) per level, ``depth`` levels below; every leaf waits for ``go``."""
    if depth == 0:
        return int(wf.wait_signal("go", int))
    kids = [brood.start_child(n, depth - 1, _workflow_id=f"{wf.execution_id()}-{i}") for i in range(n)]
    return sum(k.result() for k in kids)


@durable_activity(name="ui.progress", autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=3600)
def progress(key: str) -> str:
    """Heartbeats how far it got, then fails: its retry waits an hour with the details kept."""
    from celery_durable import activity

    activity.heartbeat({"row": 7, "of": 10})
    raise ConnectionError("the source went away at row 7")


@durable.workflow(name="ui.importing")
def importing(key: str) -> str:
    return progress(key)
