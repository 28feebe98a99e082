"""``activity.publish(topic, value)``: a running activity appends to its execution's stream
(issue 27 §4).

The attempt creates ``apub:<n>`` (topic, value, its step and attempt, its place ``k`` among the
attempt's values) in one batch with a bump of the exec (``published``, ``wakeups``),
conditional on the exec's etag, and sends a drive. The workflow's replay takes the value into
the stream at its next wait point (engine/replay/updates.py): a ``publish`` step like
``wf.publish``'s, so readers (``handle.stream``) see one order, the history's, which never
changes, and the replay stays deterministic. A retried attempt publishes again: values are
at-least-once per attempt (the marker says which step and attempt published each). A value
published once the activity's run has ended (completed, failed, continued as new) is dropped
(False), as is one from a local activity (it has no attempt of its own: refused).
"""

from __future__ import annotations

from typing import Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.activities.context import ActivityContext, current
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.records import count_of, is_terminal, run_of
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.documents.update_docs import check_step_fits, publication_id
from celery_durable.engine.drive.upkeep import bumped
from celery_durable.engine.replay.events import check_name
from celery_durable.errors import ConflictError, DurableError
from celery_durable.stores.base import Op

__all__ = ["publish", "publish_from"]

_ANY = ValueCodec(Any)


def publish(topic: str, value: Any) -> bool:
    """Append ``value`` (JSON) to the stream ``topic`` of this activity's execution, read with
    ``handle.stream(topic)``: taken into the stream, in order, at the workflow's next wait point.
    At least once per attempt (a retried attempt publishes again); False when the run has ended.
    Only in a durable activity's attempt (not a local activity, not a plain call)."""
    ctx = current()
    if ctx is None:
        raise DurableError("activity.publish() is called from a durable activity's attempt (none runs here)")
    return publish_from(ctx, topic, value)


def publish_from(ctx: ActivityContext, topic: str, value: Any) -> bool:
    """Record ``value`` on ``topic`` for the attempt ``ctx``; False when its run has ended."""
    check_name("topic", topic)
    data = _ANY.encode(value, f"the value published on {topic!r}")
    eng, info = ctx.engine, ctx.info
    if eng is None:
        raise DurableError("activity.publish() needs the engine running the attempt")
    # the value fits its ``publish`` step (else, stored, that step would fail the execution)
    numbers = ("publication", "from_step", "attempt")
    check_step_fits(eng.store, info.execution_id, StepKind.PUBLISH, topic, {"value": data}, numbers)
    with ctx.publishing:
        ctx.published += 1
        k = ctx.published
    for _ in range(100):
        ex = eng.store.read(info.execution_id, EXEC_ID)
        if ex is None or is_terminal(ex) or run_of(ex) != info.run:
            return False  # nothing will take it into a stream
        now = eng.clock.now()
        n = count_of(ex, "published") + 1
        doc = {"pk": info.execution_id, "id": publication_id(n), "type": "publication", "n": n, "topic": topic}
        doc.update(value=data, run=info.run, seq=info.step, attempt=info.attempt, k=k, at=now)
        woken = bumped(ex, now, eng.settings.drive_timeout, published=n)
        try:
            eng.store.batch(info.execution_id, [Op.create(doc), Op.replace(woken, if_match=ex["_etag"])])
        except ConflictError:
            continue  # the execution moved on (a drive, a signal, another value): look again
        eng.dispatcher.send_drive(info.execution_id)
        return True
    raise DurableError(f"could not publish on {topic!r} for {info.execution_id!r}: too much contention")
