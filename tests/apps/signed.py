"""A Celery app whose messages are signed with Celery's ``auth`` serializer (``app.setup_security()``):
``celery -A tests.apps.signed worker``. Its key and certificate are in ``$TEST_SECURITY_DIR``
(``key.pem``, ``cert.pem``, made by the test); it accepts nothing else, so a message of the
library's sent as plain JSON is refused. Configured from the environment like tests.apps.basic.

Importing it calls ``setup_security()``, which disables kombu's insecure serializers in the whole
process: only subprocesses (the worker, the test's client) import it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.glue.outbox import effect_context
from tests.apps._common import env_app, mark_in

KEYS = Path(os.environ.get("TEST_SECURITY_DIR", "/nonexistent"))
app = env_app(
    "signed",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "0")),
    durable_outbox_scan_interval=2.0,
)
app.conf.update(
    task_serializer="auth",
    event_serializer="auth",
    result_serializer="auth",
    accept_content=["auth"],
    result_accept_content=["auth"],
    security_key=str(KEYS / "key.pem"),
    security_certificate=str(KEYS / "cert.pem"),
    security_cert_store=str(KEYS / "cert*.pem"),  # a glob: the trusted certificates
    security_digest="sha256",
)
app.setup_security()
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


@durable_activity
def inc(x: int) -> int:
    return x + 1


@durable_activity(autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
def flaky(key: str, x: int) -> int:
    """Fails its first attempt: its retry is a message of its own."""
    if mark_in(MARKS, f"flaky-{key}") == 1:
        raise ConnectionError("first attempt fails")
    return x * 10


class Note(BaseModel):
    text: str


@durable.effect("signed.note")
def note(payload: Note) -> None:
    """Fails its first attempt (a retry message of the effect task), then marks that it ran."""
    if effect_context().attempt == 1:
        raise ConnectionError("first attempt fails")
    mark_in(MARKS, f"note-{payload.text}")


@durable.workflow(name="signed.flow")
def flow(key: str, x: int) -> int:
    y = inc(x)
    y = flaky(key, y)
    wf.sleep(0.3)  # a durable timer: its fire_clock message
    wf.emit("signed.note", Note(text=key))
    return inc(y)
