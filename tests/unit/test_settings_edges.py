"""Found by the adversarial review: settings validation and secret redaction (``celery_durable/settings.py``).

README: "Bad input ... gets a clear error"; "keys and passwords in the store URL are shown as
``***`` in ``repr(durable.settings)``".
"""

from __future__ import annotations

import math

import pytest

from celery_durable.errors import ConfigurationError
from celery_durable.settings import Settings


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
    from celery_durable.stores._cosmos_config import parse_url

    url = "cosmos://acct.documents.azure.com:443/?database=d&container=c&k%65y=TOPSECRETKEY"
    assert parse_url(url, {})[3] == "TOPSECRETKEY"  # it is used as the account key
    assert "TOPSECRETKEY" not in repr(Settings(store_url=url))
