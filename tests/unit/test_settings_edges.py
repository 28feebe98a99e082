"""Found by the adversarial review: settings validation and secret redaction (``celery_durable/settings.py``).

README: "Bad input ... gets a clear error"; "keys and passwords in the store URL are shown as
``***`` in ``repr(durable.settings)``".
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker import control

from celery_durable import Durable
from celery_durable.errors import ConfigurationError
from celery_durable.settings import Settings
from celery_durable.stores.sqlite.store import from_url as sqlite_from_url


def test_nan_lease_ttl_is_refused() -> None:
    # NaN passes "value < 0" and "value == 0" and "heartbeat_interval >= lease_ttl" (all False):
    # every lease would then be born expired (lease_live compares expires > now)
    with pytest.raises(ConfigurationError):
        Settings.from_conf({"durable_lease_ttl": math.nan})


def test_non_boolean_install_beat_is_refused() -> None:
    # "maybe" is kept as a truthy string instead of a clear error (_coerce falls through)
    with pytest.raises(ConfigurationError):
        Settings.from_conf({"durable_install_beat": "maybe"})


def test_fractional_count_is_refused() -> None:
    # an int setting silently keeps a float: 2.5 lost attempts
    with pytest.raises(ConfigurationError):
        Settings.from_conf({"durable_max_lost_attempts": 2.5})


def test_percent_encoded_key_parameter_is_redacted() -> None:
    # the Cosmos store decodes the query (parse_qsl): "k%65y" *is* the key parameter
    from celery_durable.stores.cosmos.config import parse_url

    url = "cosmos://acct.documents.azure.com:443/?database=d&container=c&k%65y=TOPSECRETKEY"
    assert parse_url(url, {})[3] == "TOPSECRETKEY"  # it is used as the account key
    assert "TOPSECRETKEY" not in repr(Settings(store_url=url))


# --- issue 12 "edges": configuration and start-up ---------------------------------------------

SECRET = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="
COSMOS_URL = f"cosmos://acct.documents.azure.com:443/?database=d&container=c&key={SECRET}"


def _app(**conf: Any) -> Celery:
    app = Celery("settings-edges", broker="memory://", set_as_current=False)
    app.conf.update(**conf)
    return app


@pytest.mark.parametrize(
    ("key", "hint"),
    [("durable_stor_url", "'durable_store_url'?"), ("DURABLE_STOR_URL", "'DURABLE_STORE_URL' (durable_store_url)?")],
)
def test_typo_in_app_conf_is_refused_with_a_suggestion_in_its_spelling(key: str, hint: str) -> None:
    app = _app(**{key: "sqlite:////elsewhere/durable.db"})
    with pytest.raises(ConfigurationError) as info:
        Durable(app)
    assert str(info.value).endswith(f"did you mean {hint}")


def test_typo_in_a_keyword_override_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigurationError, match=r"did you mean 'durable_store_url'"):
        Durable(_app(), stor_url="sqlite:////elsewhere/durable.db")  # a configured app: at once
    # an app not configured yet: at the latest when the settings are first read
    with pytest.raises(ConfigurationError, match=r"did you mean 'durable_store_url'"):
        lazy = Durable(Celery("settings-edges-lazy", set_as_current=False), stor_url="sqlite:////elsewhere/durable.db")
        lazy.settings  # noqa: B018 - reading them is the check


class _DjangoStyle:
    """``app.config_from_object("django.conf:settings", namespace="CELERY")``: every key prefixed."""

    CELERY_BROKER_URL = "memory://"
    CELERY_DURABLE_STORE_URL = "sqlite:////srv/shared/durable.db"
    CELERY_DURABLE_LEASE_TTL = 45


def test_namespaced_keys_are_read() -> None:
    # Celery itself resolves ``conf.durable_store_url`` to CELERY_DURABLE_STORE_URL under a
    # namespace; the settings skipped the prefixed key and fell back to ./celery_durable.db
    app = Celery("settings-edges-ns", set_as_current=False)
    app.config_from_object(_DjangoStyle, namespace="CELERY")
    settings = Settings.from_conf(app.conf)
    assert settings.store_url == "sqlite:////srv/shared/durable.db"
    assert settings.lease_ttl == 45.0


def test_namespaced_typo_is_refused_with_a_suggestion() -> None:
    class Typo(_DjangoStyle):
        CELERY_DURABLE_STOR_URL = "sqlite:////srv/shared/durable.db"

    app = Celery("settings-edges-ns-typo", set_as_current=False)
    app.config_from_object(Typo, namespace="CELERY")
    with pytest.raises(
        ConfigurationError,
        match=r"'CELERY_DURABLE_STOR_URL'; did you mean 'CELERY_DURABLE_STORE_URL' \(durable_store_url\)\?",
    ):
        Settings.from_conf(app.conf)


@pytest.mark.parametrize("namespaced", [False, True], ids=["plain", "namespace"])
def test_store_url_key_is_censored_where_celery_censors_secrets(namespaced: bool) -> None:
    if namespaced:
        app = Celery("settings-edges-censor-ns", set_as_current=False)
        app.config_from_object(
            {"CELERY_BROKER_URL": "memory://", "CELERY_DURABLE_STORE_URL": COSMOS_URL}, namespace="CELERY"
        )
    else:
        app = _app(durable_store_url=COSMOS_URL)
    durable = Durable(app)
    assert durable.settings.store_url == COSMOS_URL  # the store still gets the key
    shown = {
        "celery report": app.bugreport(),
        "humanize": app.conf.humanize(with_defaults=False, censored=True),
        "table": json.dumps(app.conf.table(with_defaults=True, censored=True), default=repr),
        # what ``celery inspect conf`` sends back (the worker's control command)
        "inspect conf": json.dumps(control.conf(SimpleNamespace(app=app), with_defaults=False)),
        "inspect conf with defaults": json.dumps(control.conf(SimpleNamespace(app=app), with_defaults=True)),
        "repr(settings)": repr(durable.settings),
    }
    for where, text in shown.items():
        assert SECRET not in text, f"the key shows in {where}"
        assert SECRET[:12] not in text, f"part of the key shows in {where}"
        assert "acct.documents.azure.com" in text, f"{where} hides the whole store URL"  # still useful


def test_new_sqlite_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: files come out 0644
    try:
        store = sqlite_from_url(f"sqlite:///{tmp_path / 'durable.db'}")
        store.create({"pk": "p", "id": "a", "n": 1})
        assert store.read("p", "a") is not None
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        store.close()
    finally:
        os.umask(old)
    assert set(modes) >= {"durable.db", "durable.db-wal", "durable.db-shm"}, modes
    assert all(mode == 0o600 for mode in modes.values()), {k: oct(v) for k, v in modes.items()}


def test_sqlite_file_mode_can_be_chosen(tmp_path: Path) -> None:
    store = sqlite_from_url(f"sqlite:///{tmp_path / 'a.db'}?file_mode=0640")
    store.create({"pk": "p", "id": "a"})
    assert stat.S_IMODE((tmp_path / "a.db").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "a.db-wal").stat().st_mode) == 0o640  # (closing removes it)
    store.close()
    # a keyword option (``durable_store_options``) works as well
    store = sqlite_from_url(f"sqlite:///{tmp_path / 'b.db'}", file_mode=0o660)
    store.read("p", "a")
    store.close()
    assert stat.S_IMODE((tmp_path / "b.db").stat().st_mode) == 0o660


def test_an_existing_sqlite_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    path.touch()
    path.chmod(0o664)  # the operator's choice
    store = sqlite_from_url(f"sqlite:///{path}")
    store.read("p", "a")
    store.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o664


@pytest.mark.parametrize("mode", ["rw", "0400", "1777", "0o1600", "-1"])
def test_a_bad_sqlite_file_mode_is_refused(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ConfigurationError, match="file_mode"):
        sqlite_from_url(f"sqlite:///{tmp_path / 'a.db'}?file_mode={mode}")
    assert not (tmp_path / "a.db").exists()
