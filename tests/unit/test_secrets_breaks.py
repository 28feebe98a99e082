"""Adversarial tests of store-URL secrets (celery_durable/settings.py ``redact_url``).

Promise (README "Configuration"): "Keys and passwords in the store URL are shown as ``***`` in
``repr(durable.settings)``, ``celery report``, ``celery inspect conf`` and
``app.conf.humanize()``/``table()``".
"""

from __future__ import annotations

import traceback
from urllib.parse import urlsplit

import pytest
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st

import celery_durable  # noqa: F401 - importing it adds durable_store_url to what Celery censors
from celery_durable.errors import ConfigurationError, StoreUnavailable
from celery_durable.settings import Settings, redact_url
from celery_durable.stores import store_from_url

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


# A raw '#', '?', '/' or '@' in a password (issue 23: shown in clear by `celery report`,
# `inspect conf` and store errors, since the old pattern stopped the password at '/', '?', '#').
_PASSWORD = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(["postgresql", "postgres", "redis", "rediss", "cosmos"]),
    user=st.text(st.characters(blacklist_characters=":/?#@", blacklist_categories=("Cs",)), max_size=8),
    password=_PASSWORD,
    rest=st.sampled_from(["db.internal:5432/prod", "cache:6379/0", "h/app?sslmode=require", "h"]),
)
def test_a_password_is_hidden_whatever_it_holds(scheme: str, user: str, password: str, rest: str) -> None:
    """Breaks "passwords shown as ***": everything between the user's ':' and the last '@' is
    the password, whatever characters it holds, and only it is masked."""
    assert redact_url(f"{scheme}://{user}:{password}@{rest}") == f"{scheme}://{user}:***@{rest}"


@pytest.mark.parametrize("special", ["#", "?", "/", "@", "#?/@"])
def test_a_store_error_does_not_print_a_password_with_a_raw_special(special: str) -> None:
    """Such a URL does not parse, which is exactly when its error is printed and pasted into a ticket."""
    url = f"postgresql://app:Pr1vate{special}x@127.0.0.1:1/prod"
    shown = redact_url(url)
    assert "Pr1vate" not in shown and shown.endswith("@127.0.0.1:1/prod")
    app = Celery("adv-secrets-raw", set_as_current=False)
    app.conf.durable_store_url = url
    assert "Pr1vate" not in app.conf.humanize(with_defaults=False, censored=True)
    # libpq cuts the password at the raw character and quotes the rest (as a host, a port or a
    # query parameter) in its error: neither the message nor its traceback may show any of it
    with pytest.raises((ConfigurationError, StoreUnavailable)) as caught:
        store_from_url(url + "?connect_timeout=1").read("p", "d")
    told = "".join(traceback.format_exception(caught.value))
    assert "Pr1vate" not in told and "x@" not in told and "percent-encoded" in str(caught.value), told


@pytest.mark.parametrize("special", ["#", "?", "/", "@", "[", "]"])
def test_the_result_push_log_does_not_print_a_password_with_a_raw_special(
    special: str, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py cuts the password at the raw character and names the rest as the port or host."""
    from celery_durable.stores.push.redis import RedisNotifier

    notifier = RedisNotifier(f"redis://:Pr1vate{special}xy@127.0.0.1:1/0")
    with caplog.at_level("WARNING", logger="celery_durable.push"):
        notifier.publish("some-execution")
    notifier.close()
    assert "publishing to" in caplog.text and "percent-encoded" in caplog.text, caplog.text
    assert "Pr1vate" not in caplog.text and "xy" not in caplog.text, caplog.text
