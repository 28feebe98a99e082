"""Adversarial review r2 of issue 23 (the message boundary): each test FAILS on the code it was
written against and passes once the promise it names holds."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.errors import ConfigurationError, InvalidWorkflowId
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("adv-r2", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="adv_r2.echo")
def echo(x: int) -> int:
    return x


@durable.workflow(name="adv_r2.one")
def one(x: int) -> int:
    return echo(x)


# --- promise 9: invisible characters in workflow ids -----------------------------------------

#: zero-width, default-ignorable characters (Unicode Default_Ignorable_Code_Point) that are not
#: of category Cf, so ``check_workflow_id`` (Cc/Cs/Cf/Zl/Zp) lets them through: "order-1" and
#: "order-1" + one of these look the same in the UI and the CLI
INVISIBLE = [
    "\u034f",  # COMBINING GRAPHEME JOINER (Mn)
    "\ufe0f",  # VARIATION SELECTOR-16 (Mn)
    "\U000e0100",  # VARIATION SELECTOR-17 (Mn)
    "\u180b",  # MONGOLIAN FREE VARIATION SELECTOR ONE (Mn)
    "\u3164",  # HANGUL FILLER (Lo)
    "\u115f",  # HANGUL CHOSEONG FILLER (Lo)
    "\uffa0",  # HALFWIDTH HANGUL FILLER (Lo)
    "\u17b4",  # KHMER VOWEL INHERENT AQ (Mn)
]


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_a_workflow_id_with_a_zero_width_character_is_refused_at_start(char: str) -> None:
    """Promise 9: an id holding a zero-width character is refused in the caller before anything
    is stored. ``order-1`` followed by U+034F / U+FE0F ... is accepted and stored as a second
    execution that renders exactly like ``order-1``."""
    env = WorkflowEnvironment(durable)
    env.start(one, 1, _workflow_id="order-1")
    twin = "order-1" + char
    with pytest.raises(InvalidWorkflowId):
        env.start(one, 1, _workflow_id=twin)
    assert env.store.read(twin, "exec") is None


# --- promise 8: a password is never printed, whatever characters it holds ---------------------


@pytest.mark.parametrize(
    "password",
    ["p%zzS3CRETpw", "S3CRETpw%", "S3CRET%00pw"],
    ids=["bad-escape", "trailing-percent", "escaped-nul"],
)
def test_a_raw_percent_in_a_postgres_password_is_not_echoed_by_the_store_error(password: str) -> None:
    """Promise 8: a store error never prints the password. A raw ``%`` that starts no valid
    escape (or an escaped NUL) makes libpq fail with ``invalid percent-encoded token: "<the
    whole password>"``; ``url_password_is_raw`` only knows ``# ? / @``, so the ConfigurationError
    quotes libpq's message, password included."""
    from celery_durable.stores import store_from_url

    url = f"postgresql://app:{password}@127.0.0.1:5432/test"
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)
    shown = f"{info.value}\n{info.value.__cause__!r}"
    assert "S3CRET" not in shown, shown


def test_a_schedule_name_with_a_bidi_override_is_refused_before_anything_is_stored() -> None:
    """Promise 9 (every entry point): ``durable.schedule(name, ...)`` names each tick's execution
    ``"{name}@{tick}"`` but never checks ``name``: a schedule called ``"nightly\\u202egpj.exe"``
    is accepted, and its first tick stores an execution whose id holds a RIGHT-TO-LEFT OVERRIDE
    (shown as ``nightlyexe.jpg@...``)."""
    from datetime import timedelta

    from celery_durable.glue.tasks import START_SCHEDULED_TASK

    sapp = Celery("adv-r2-sched", set_as_current=False)
    sdurable = Durable(sapp, store="memory://")
    wf = sdurable.workflow(name="adv_r2.sched_one")(lambda x: x)
    name = "nightly\u202egpj.exe"
    refused = False
    try:
        sdurable.schedule(name, wf, timedelta(hours=1), 1)
    except (InvalidWorkflowId, ConfigurationError):
        refused = True
    if not refused:  # accepted: show what beat's first tick does with it
        entry = sapp.conf.beat_schedule[f"{START_SCHEDULED_TASK}:{name}"]
        outcome = sapp.tasks[START_SCHEDULED_TASK](*entry["args"])
        pytest.fail(f"schedule name {name!r} accepted; its first tick: {outcome!r}")


# --- promise 6: pickle is never sent ------------------------------------------------------------


def test_auth_signing_over_pickle_still_sends_pickle() -> None:
    """Promise 6: "pickle is never sent" (glue/wire.py turns a ``pickle`` task_serializer into json,
    and says "what they carry is JSON-native in any case, so auth wraps JSON"). But Celery's
    ``app.setup_security(serializer="pickle")`` makes ``auth`` sign a *pickled* body:
    ``wire.serializer`` passes ``auth`` through unchecked, so the library's own drive message is
    a pickle inside the signature (content type application/x-python-serialize in the signed
    envelope). Run in a subprocess: setup_security() changes kombu for the whole process."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "message_boundary_scripts" / "auth_inner_serializer.py"
    out = subprocess.run(
        [sys.executable, str(script), "pickle"], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 or "ConfigurationError" in out.stderr, out.stderr[-2000:]
    assert "pickle inside" not in out.stdout, out.stdout


def test_a_task_annotation_saying_pickle_makes_the_library_send_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Promise 6: "pickle is never sent" (glue/wire.py: the library's tasks' ``serializer`` is a
    property that turns pickle into json). Celery's ``task_annotations`` set attributes on
    every task *class* (``Task.annotate``: ``setattr(cls, key, value)``), which replaces
    WireTask's ``serializer`` property: with ``{"*": {"serializer": "pickle"}}`` every message
    beat sends for the library (recover, fire_due_clocks, outbox_scan) and every retry of a
    drive or timer goes as pickle, though task_serializer is json."""
    from celery_durable.glue.tasks import DRIVE_TASK, FIRE_DUE_CLOCKS_TASK, RECOVER_TASK

    aapp = Celery("adv-r2-annot", broker="memory://", set_as_current=False)
    aapp.conf.update(
        durable_store_url="memory://",
        task_serializer="json",
        accept_content=["json", "pickle"],
        task_annotations={"*": {"serializer": "pickle"}},
    )
    Durable(aapp)
    sent: dict[str, list[str | None]] = {}

    def send_task_message(producer: object, name: str, message: object, **kwargs: object) -> None:
        sent.setdefault(name, []).append(kwargs.get("serializer"))  # type: ignore[arg-type]

    monkeypatch.setattr(aapp.amqp, "send_task_message", send_task_message)
    for name, args in ((RECOVER_TASK, []), (FIRE_DUE_CLOCKS_TASK, []), (DRIVE_TASK, ["e1"])):
        aapp.tasks[name].apply_async(args=args)  # what beat (or a retry of the task) sends
    pickled = {name: s for name, s in sent.items() if "pickle" in s}
    assert not pickled, f"the library's own messages sent as pickle: {pickled}"


def test_a_start_scheduled_message_stores_an_id_no_caller_checked() -> None:
    """Promise 9 (every entry point) at the message boundary: the ``start_scheduled`` task
    stores ``"{schedule name}@{tick}"`` from its message's arguments, never through
    ``check_workflow_id``: a message published with a name holding a newline and a bidi
    override (or an entry of an older beat schedule) creates such an execution."""
    from celery_durable.glue.tasks import START_SCHEDULED_TASK

    sapp = Celery("adv-r2-sched2", set_as_current=False)
    sdurable = Durable(sapp, store="memory://")
    sdurable.workflow(name="adv_r2.sched_two")(lambda x: x)
    name = "nightly\n\u202egpj.exe"
    try:
        outcome = sapp.tasks[START_SCHEDULED_TASK](name, "adv_r2.sched_two", {"args": [1], "kwargs": {}}, 3600.0)
    except InvalidWorkflowId:
        return
    ids = [s.id for s in sdurable.list_executions().executions]
    assert not any(name in str(i) for i in ids), f"{outcome!r}; stored: {ids!r}"


# --- promise 5: a sealed outcome is not replayable into another execution of the same id ------

papp = Celery("adv-r2-purge", broker="memory://", set_as_current=False)
pdurable = Durable(papp, store="memory://")
INVOICED: list[int] = []


@durable_activity(name="adv_r2p.invoice")
def invoice(order: int) -> int:
    INVOICED.append(order)
    return 1000 + len(INVOICED)


@pdurable.workflow(name="adv_r2p.flow")
def invoice_flow(order: int) -> int:
    return invoice(order)


def test_a_sealed_outcome_of_a_purged_execution_completes_the_restarted_one() -> None:
    """Promises 5 and 1: a step's result comes only from running its activity or from an outcome
    sealed *for that step*; delivery.py lists "a purged id is started again" among the cases an
    old message must not complete. But the token is ``sha256(id, run, seq, resets)``: an
    execution started again under a purged id gets the very same token at the same step, so a
    sealed outcome message of the purged execution (a store-outage hand-off still queued, or one
    a broker reader kept) is verified and recorded as the new execution's result — the
    activity never runs for it."""
    import time

    from celery_durable.engine.documents.schema import result_id
    from celery_durable.engine.drive import seals
    from celery_durable.glue.durable_activity import DURABLE_HEADER
    from celery_durable.glue.tasks import _step_header

    eng = pdurable.engine
    sent: list = []
    eng.dispatcher.send_activity = sent.append  # type: ignore[method-assign]
    eng.dispatcher.send_drive = lambda *a, **k: None  # type: ignore[method-assign]
    eid, _ = eng.start(invoice_flow.definition, (7,), {}, workflow_id="inv-7")
    eng.drive(eid)
    old = sent.pop()
    # what the library itself sends when the old attempt ran but the store failed at its commit
    doc = {
        "pk": eid, "id": result_id(old.seq, old.run), "type": "result", "run": old.run, "seq": old.seq,
        "name": old.name, "attempts": 1, "completed_at": time.time(), "ok": True, "value": 4242,
    }  # fmt: skip
    old_meta = dict(_step_header(old), sealed=seals.seal_outcome(eng.store, (eid, old.run, old.seq), old.token, doc))
    eng.cancel(eid, by="operator")
    eng.drive(eid)
    time.sleep(0.05)
    assert pdurable.purge(0.01).purged == 1
    eid2, _ = eng.start(invoice_flow.definition, (7,), {}, workflow_id="inv-7")  # the id again
    eng.drive(eid2)
    sent.clear()
    task = papp.tasks[old.name]
    task.push_request(
        id=old.task_id, args=list(old.args), kwargs={}, headers={DURABLE_HEADER: old_meta},
        retries=0, is_eager=False, called_directly=False, delivery_info={},
    )  # fmt: skip
    try:
        task(*old.args)  # the old execution's message arrives
    finally:
        task.pop_request()
    ex = eng.store.read(eid2, "exec") or {}
    assert ex.get("result") != 4242, f"the restarted execution took the purged one's result; ran: {INVOICED}"


def test_the_sqlite_store_error_prints_the_password_of_its_url() -> None:
    """Promise 8: "a password in any store URL is never printed (... store errors ...)". A
    ``sqlite://`` URL given a user and password (a PostgreSQL URL's credentials left in place
    when the scheme was switched, say) is refused with the URL quoted raw, password and all."""
    from celery_durable.stores import store_from_url

    with pytest.raises(ConfigurationError) as info:
        store_from_url("sqlite://app:S3CRETpw@db.internal/durable.db")
    assert "S3CRET" not in str(info.value), str(info.value)


def test_a_worker_refusing_to_start_prints_a_percent_password() -> None:
    """Promise 8 at the worker's start (``check_store``: the one line a worker prints, and logs
    with --logfile): the message goes through ``redact_url`` whole, which finds the URL's own
    userinfo already masked and so leaves libpq's quote of the password (``"p%zzS3CRETpw"``)."""
    from celery_durable.glue.bootsteps import check_store

    wapp = Celery("adv-r2-worker", set_as_current=False)
    wapp.conf.durable_store_url = "postgresql://app:p%zzS3CRETpw@127.0.0.1:5432/test"
    with pytest.raises(SystemExit) as info:
        check_store(Durable(wapp))
    assert "S3CRET" not in str(info.value.code), info.value.code


# --- (outside r2's focus, found on the way) item 2: an effect silently dropped ----------------

fapp = Celery("adv-r2-fx", set_as_current=False)
fdurable = Durable(fapp, store="memory://")
MAILED: list[str] = []


@fdurable.effect("adv_r2.mail")
def mail(payload: str) -> None:
    MAILED.append(payload)


@fdurable.workflow(name="adv_r2.mailer")
def mailer(to: str) -> str:
    from celery_durable import workflow as wf

    return wf.emit("adv_r2.mail", to)


def test_an_execution_started_again_under_a_purged_id_runs_its_own_effect() -> None:
    """Issue 23 item 2 ("a re-run's effect is a new effect, or the user is told — never a silent
    drop"), for an id purged and started again: the default effect id was ``<id>:<step>``, the
    purged execution's outbox row outlives it (outbox_retention), so the new execution's
    ``emit`` returned the same effect id, was taken for the old effect and never ran; the new
    execution completed as if it had (xfail until reruns.reborn)."""
    from celery_durable.engine.admin.operator import Admin

    env = WorkflowEnvironment(fdurable)
    first = env.start(mailer, "a@example.com", _workflow_id="mail-1")
    env.result(first)
    env.advance(10)
    assert MAILED == ["a@example.com"]
    assert Admin(env.engine).purge(1).purged == 1
    again = env.start(mailer, "a@example.com", _workflow_id="mail-1")  # a new execution, same id
    effect_id = env.result(again)
    env.advance(10)
    assert MAILED == ["a@example.com", "a@example.com"], f"effect {effect_id} of the new execution never ran"
