"""Every message the library sends uses the app's serializer (glue/wire.py): ``auth`` (Celery's message
signing) passes through, ``pickle`` becomes ``json``, and an app that accepts neither is refused
at ``Durable(app)``. Each message is caught where Celery hands it to kombu (``send_task_message``)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry
from kombu.serialization import register

from celery_durable import Durable, durable_activity
from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.outbox.model import EffectRef
from celery_durable.errors import ConfigurationError
from celery_durable.glue.session_tokens import retry_stale
from celery_durable.glue.tasks import DRIVE_TASK, FIRE_CLOCK_TASK, FIRE_DUE_CLOCKS_TASK, RECOVER_TASK, CeleryDispatcher
from celery_durable.glue.wire import serializer

# a stand-in for 'auth' (what app.setup_security() sets; the end-to-end test uses the real one)
register("wiresig", json.dumps, json.loads, content_type="application/x-wiresig", content_encoding="utf-8")


@durable_activity(name="wire.step")
def step(x: int) -> int:
    return x + 1


def _app(tmp_path: Path, name: str, **conf: Any) -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.update(durable_store_url=f"sqlite:///{tmp_path / 'store.db'}", **conf)
    return app


def _sent(app: Celery, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str | None]]:
    """Task name -> the serializers its messages were sent with (nothing reaches the broker)."""
    sent: dict[str, list[str | None]] = {}

    def send_task_message(producer: Any, name: str, message: Any, **kwargs: Any) -> None:
        sent.setdefault(name, []).append(kwargs.get("serializer"))

    monkeypatch.setattr(app.amqp, "send_task_message", send_task_message)
    return sent


def _send_everything(durable: Durable) -> None:
    app = durable.app

    @durable.effect("wire.fx")
    def fx(payload: Any) -> None:
        pass

    dispatcher = durable.engine.dispatcher
    assert isinstance(dispatcher, CeleryDispatcher)
    dispatcher.send_drive("e1")
    dispatcher.send_clock(ClockRequest("e1", 2, time.time() + 1))
    dispatcher.publish_activity(ActivityRequest("e1", 1, "wire.step", [1], {}, "t1", "wf"))
    dispatcher.publish_activity(ActivityRequest("e1", 3, "elsewhere.step", [1], {}, "t3", "wf"))  # by name
    dispatcher.send_effect(EffectRef("k", "fx1", "wire.fx"))
    # what a retry, the stale-read retry or beat sends: the task's own options
    # a durable activity's retry() (its own Celery retry, autoretry_for's too)
    step_task = app.tasks["wire.step"]
    step_task.push_request(
        id="t1", args=[1], kwargs={}, headers={}, delivery_info={}, retries=0, is_eager=False, called_directly=False
    )
    attempt = SimpleNamespace(holder="h", execution_id="e1", run=0, seq=1)
    step_task.request.durable_attempt, step_task.request.durable_released = attempt, True
    try:
        with pytest.raises(Retry):
            step_task.retry(countdown=5)
        assert retry_stale(step_task, SimpleNamespace(incr=lambda name: None), "a stale read")  # its re-send
    finally:
        step_task.pop_request()
    effect_task = durable.outbox.effects.get("wire.fx").task_name
    calls = {DRIVE_TASK: ["e1"], FIRE_CLOCK_TASK: ["e1", 2], FIRE_DUE_CLOCKS_TASK: [], RECOVER_TASK: []}
    for name, args in (calls | {effect_task: ["k", "fx1"]}).items():
        app.tasks[name].apply_async(args=args)


EXPECTED = {DRIVE_TASK, FIRE_CLOCK_TASK, FIRE_DUE_CLOCKS_TASK, RECOVER_TASK, "wire.step", "elsewhere.step"}


def test_signing_serializer_passes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(tmp_path, "wire-auth", task_serializer="wiresig", accept_content=["wiresig"])
    durable = Durable(app)
    sent = _sent(app, monkeypatch)
    _send_everything(durable)
    assert EXPECTED <= set(sent)
    assert len(sent) == len(EXPECTED) + 1  # and the effect's task
    assert len(sent["wire.step"]) == 3  # its message, its retry, the stale-read re-send
    assert {name: set(s) for name, s in sent.items()} == {name: {"wiresig"} for name in sent}


def test_pickle_is_sent_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(tmp_path, "wire-pickle", task_serializer="pickle", accept_content=["pickle", "json"])
    durable = Durable(app)
    assert serializer(app) == "json"
    sent = _sent(app, monkeypatch)
    _send_everything(durable)
    assert EXPECTED <= set(sent)
    assert {name: set(s) for name, s in sent.items()} == {name: {"json"} for name in sent}


@pytest.mark.parametrize("accept", [["pickle"], ["application/x-python-serialize", "yaml"]])
def test_pickle_without_json_is_refused_at_setup(tmp_path: Path, accept: list[str]) -> None:
    app = _app(tmp_path, "wire-refused", task_serializer="pickle", accept_content=accept)
    with pytest.raises(ConfigurationError, match="accept_content"):
        Durable(app)


def test_pickle_configured_after_setup_is_refused_before_any_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery("wire-late", broker="memory://", set_as_current=False)
    durable = Durable(app)  # not configured yet: nothing to check
    app.conf.update(
        durable_store_url=f"sqlite:///{tmp_path / 'store.db'}", task_serializer="pickle", accept_content=["pickle"]
    )
    sent = _sent(app, monkeypatch)
    with pytest.raises(ConfigurationError, match="accept_content"):
        durable.engine  # noqa: B018 - building it is what checks
    assert sent == {}


@pytest.mark.parametrize("seed", range(4))
def test_random_configurations_never_send_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Seeded: whatever task_serializer and accept_content say, the library either refuses at
    set-up (pickle, and no json accepted) or sends every message with the app's serializer (json
    for pickle), never pickle."""
    rng = random.Random(seed)
    kinds = ["json", "application/json", "wiresig", "pickle", "application/x-python-serialize"]
    for i in range(6):
        ser = rng.choice(["json", "wiresig", "pickle"])
        accept = None if rng.random() < 0.15 else rng.sample(kinds, rng.randint(1, 3))
        if ser != "pickle" and accept is not None:
            accept.append(ser)  # an app that accepts its own serializer (else Celery itself fails)
        folder = tmp_path / str(i)
        folder.mkdir()
        app = _app(folder, f"wire-rnd-{seed}-{i}", task_serializer=ser, accept_content=accept)
        json_ok = accept is None or bool({"json", "application/json"} & set(accept))
        if ser == "pickle" and not json_ok:
            with pytest.raises(ConfigurationError):
                Durable(app)
            continue
        durable = Durable(app)
        sent = _sent(app, monkeypatch)
        _send_everything(durable)
        expected = "json" if ser == "pickle" else ser
        assert EXPECTED <= set(sent)
        assert {s for each in sent.values() for s in each} == {expected}, (ser, accept)
