"""One Settings object: every ``durable_*`` key settable from ``app.conf``, typos refused, secrets hidden."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta

import pytest
from celery import Celery

from celery_durable import ConfigurationError, Durable, DurableSettings
from celery_durable.engine.outbox import OutboxSettings
from celery_durable.settings import Settings, redact_url


def _app(**conf: object) -> Celery:
    app = Celery("settings-test", set_as_current=False)
    app.conf.update(**conf)
    return app


def _changed(f_name: str, value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 if f_name != "heartbeat_interval" else value / 2
    if isinstance(value, dict):
        return {"x": 1}
    if f_name == "result_push":
        return "off"
    return "memory://"


def test_every_field_is_settable_from_app_conf_and_reaches_the_engine() -> None:
    default = Settings()
    conf = {f"durable_{f.name}": _changed(f.name, getattr(default, f.name)) for f in fields(Settings)}
    conf["durable_store_options"] = {}
    durable = Durable(_app(**conf))
    settings = durable.settings
    for f in fields(Settings):
        assert getattr(settings, f.name) == conf[f"durable_{f.name}"], f.name
    engine = durable.engine
    assert engine.settings is not None
    # the engine reads the same object: fields the old engine settings dropped are there
    assert engine.settings.max_lost_attempts == conf["durable_max_lost_attempts"]
    assert engine.settings.trust_cache_for == conf["durable_trust_cache_for"]
    outbox = OutboxSettings.of(settings)
    assert outbox.retention == conf["durable_outbox_retention"]
    assert outbox.lease_ttl == settings.lease_ttl


def test_a_typo_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigurationError, match="durable_stor_url.*did you mean 'durable_store_url'"):
        _ = Durable(_app(durable_stor_url="sqlite:///x.db")).settings
    with pytest.raises(ConfigurationError, match="durable_leas_ttl.*durable_lease_ttl"):
        Settings.from_conf({}, leas_ttl=3)


def test_values_are_typed_and_checked() -> None:
    s = Settings.from_conf({"durable_lease_ttl": timedelta(minutes=1), "durable_drive_timeout": "12.5"})
    assert s.lease_ttl == 60.0 and s.drive_timeout == 12.5
    with pytest.raises(ConfigurationError, match="durable_lease_ttl must be a number"):
        Settings.from_conf({"durable_lease_ttl": "soon"})
    with pytest.raises(ConfigurationError, match="must be > 0"):
        Settings(max_lost_attempts=0)
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        Settings(lease_ttl=5, heartbeat_interval=5)
    assert DurableSettings is Settings


@pytest.mark.parametrize(
    "url",
    [
        "cosmos://acct.documents.azure.com/db/c?key=c2VjcmV0S2V5PT0=",
        "cosmos://acct.documents.azure.com/db/c;AccountKey=c2VjcmV0S2V5PT0=",
        "postgresql://user:c2VjcmV0S2V5PT0=@db.example/x",
    ],
)
def test_secrets_in_the_store_url_are_never_shown(url: str) -> None:
    s = Settings(store_url=url)
    assert "c2VjcmV0S2V5PT0=" not in repr(s)
    assert "c2VjcmV0S2V5PT0=" not in redact_url(url)
    assert "***" in repr(s)
