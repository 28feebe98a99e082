"""Adversarial tests of store-URL secrets (celery_durable/settings.py ``redact_url``).

Promise (README "Configuration"): "Keys and passwords in the store URL are shown as ``***`` in
``repr(durable.settings)``, ``celery report``, ``celery inspect conf`` and
``app.conf.humanize()``/``table()``".
"""

from __future__ import annotations

from urllib.parse import urlsplit

from celery import Celery

import celery_durable  # noqa: F401 - importing it adds durable_store_url to what Celery censors
from celery_durable.settings import Settings, redact_url

#: a password with an empty user name, as libpq and Redis URLs commonly carry it
NO_USER = "postgresql://:S3CRET-pw@db.internal:5432/app"


def test_repr_of_settings_hides_a_password_without_a_user_name() -> None:
    """Breaks "passwords shown as ***": the userinfo pattern needs a non-empty user name, so
    ``repr(durable.settings)`` prints ``postgresql://:S3CRET-pw@...`` in full."""
    assert "S3CRET" not in repr(Settings(store_url=NO_USER))


def test_celery_report_hides_a_password_without_a_user_name() -> None:
    """Breaks "passwords shown as *** in celery report / humanize()": the same URL is shown in
    full by ``app.conf.humanize()`` (what ``celery report`` prints)."""
    app = Celery("adv-secrets", set_as_current=False)
    app.conf.durable_store_url = NO_USER
    assert "S3CRET" not in app.conf.humanize(with_defaults=False, censored=True)


def test_a_password_holding_an_at_sign_is_hidden_whole() -> None:
    """Breaks "passwords shown as ***": in ``postgres://u:p@ss@db/app`` (URL parsers take the
    last '@': the password is ``p@ss``) only ``p`` is masked and ``ss`` is shown."""
    shown = redact_url("postgres://u:p@ss@db/app")
    assert urlsplit(shown).password == "***", shown
