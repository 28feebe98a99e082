"""One typed :class:`Settings` for the whole library, read from Celery's ``durable_*`` keys.

Every field is settable from ``app.conf`` as ``durable_<field>`` (seconds, or a ``timedelta``)
and from ``Durable(app, <field>=...)``; an unknown ``durable_*`` key raises with a suggestion, so
a typo cannot silently fall back to a default store. Under a Celery namespace
(``config_from_object(..., namespace="CELERY")``) the keys are ``CELERY_DURABLE_*``. The engine,
the outbox and the Celery glue all read this one object (the outbox engine takes a view of it:
``OutboxSettings.of(settings)``).

=====================================  ==========================  ===============================
setting                                default                     meaning
=====================================  ==========================  ===============================
``durable_store_url``                  ``$DURABLE_STORE_URL`` or   where state lives
                                       ``sqlite:///celery_durable.db``
``durable_store_options``              {}                          extra backend options
``durable_lease_ttl``                  30 s                        lease lifetime (drives, attempts)
``durable_heartbeat_interval``         10 s                        lease renewal cadence (< ttl)
``durable_recovery_interval``          15 s                        beat: lapsed leases, lost messages
``durable_clock_interval``             1 s                         beat: due timers
``durable_activity_queue_timeout``     300 s                       unstarted activity → re-sent
``durable_drive_timeout``              30 s                        undriven execution → re-driven
``durable_timer_fast_path_max``        60 s                        timers up to this get a countdown
                                                                   task too (0: beat's scan only)
``durable_install_beat``               True                        beat runs the scans and schedules
``durable_scans_in_beat``              True                        the scans run inside beat (False:
                                                                   beat sends them as tasks)
``durable_unknown_retry_delay``        60 s                        workflow unknown here → retried
``durable_max_lost_attempts``          10                          lost activity attempts → failed
``durable_max_payload``                64 MiB                      largest document (payload) stored,
                                                                   offloaded in chunks past 2 MB
``durable_optimistic_attempts``        2                           drive conflicts → take the lease
``durable_trust_cache_for``            2 s                         inline drive reuses a fresh read
``durable_sticky_cache_size``          256                         live workflow instances per thread
``durable_eager_start``                False                       ``start()`` drives the first step in
                                                                   the caller (no drive message)
``durable_eager_activities``           16                          activities a worker runs after its
                                                                   own, unsent (0: off)
``durable_outbox_scan_interval``       5 s                         beat: lost effects, due retries
``durable_outbox_retention``           7 days                      settled rows then deleted
``durable_outbox_queue_timeout``       60 s                        unclaimed row re-sent after this
``durable_outbox_cancel_poll``         1 s                         running handler checks for cancel
``durable_outbox_fast_send_max``       60 s                        delays up to this: countdown
``durable_outbox_admit_grace``         10 s                        unadmitted intent → scan admits
``durable_outbox_max_lane_backlog``    10,000                      live rows per key
``durable_outbox_drain_max``           50                          rows of a key one delivery runs in a row
``durable_metrics_port``              None                        worker serves Prometheus /metrics
``durable_result_push``                ``"auto"``                  wake ``handle.result()`` by a push:
                                                                   PostgreSQL LISTEN/NOTIFY, else Redis
                                                                   pub/sub (broker/backend), else poll;
                                                                   ``"off"``, or a ``redis://`` URL
``durable_result_poll_max``            0.05 s                      longest poll interval without push
``durable_result_push_recheck``        2 s                         with push: re-read at least this often
=====================================  ==========================  ===============================
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

from celery_durable.errors import ConfigurationError

#: values of ``durable_result_push`` besides a ``redis://`` / ``rediss://`` URL (stores/push/base.py)
PUSH_MODES = ("auto", "off")
REDIS_SCHEMES = ("redis://", "rediss://")

__all__ = ["Settings", "DurableSettings", "DEFAULT_STORE_URL", "redact_url", "censor_conf"]

DEFAULT_STORE_URL = "sqlite:///celery_durable.db"

PREFIX = "durable_"

#: fields that may be 0 (others that are numbers must be > 0)
_MAY_BE_ZERO = frozenset(
    {
        "timer_fast_path_max",
        "outbox_fast_send_max",
        "outbox_admit_grace",
        "trust_cache_for",
        "outbox_drain_max",
        "sticky_cache_size",
        "eager_activities",
    }
)

# key=..., password=..., AccountKey=..., the password of user:password@host
_SECRET_PARAM = re.compile(r"(?i)((?:key|password|secret|token|accountkey|sig)=)[^&;]+")
#: the authority's userinfo: up to the *last* '@' before the path (URL parsers take the last one,
#: so a password may hold a raw '@'), with or without a user name
_SECRET_NAME = re.compile(r"(?i).*(key|password|secret|token|sig)")


def redact_url(url: str) -> str:
    """A store URL safe to log or show: keys and passwords replaced by ``***``.

    Query parameters are compared after percent-decoding their names (``k%65y`` is ``key`` to a
    URL parser, so it must be hidden as well).
    """
    head, sep, query = url.partition("?")
    if sep:
        parts = []
        for part in re.split(r"([&;])", query):
            name, eq, _value = part.partition("=")
            if eq and _SECRET_NAME.fullmatch(unquote(name).strip()):
                part = f"{name}=***"
            parts.append(part)
        url = head + sep + "".join(parts)
    return _redact_userinfo(_SECRET_PARAM.sub(r"\1***", url))


def _redact_userinfo(url: str) -> str:
    """``scheme://user:***@host``: the password is whatever sits between the user's ``:`` and the
    *last* ``@``. A raw ``#``, ``?``, ``/`` or ``@`` in a password makes the URL unparseable, which
    is exactly when it is printed in an error, so no character may end the password early; a
    query value holding an ``@`` then hides the host too (shown too little, never too much)."""
    start, at = url.find("//"), url.rfind("@")
    if start < 0 or at < start:
        return url
    user, colon, _password = url[start + 2 : at].partition(":")
    return url if not colon else f"{url[: start + 2]}{user}:***{url[at:]}"


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")


def url_password_is_raw(url: str) -> bool:
    """Whether the password of ``url`` (as :func:`redact_url` sees it) holds a character a URL
    parser cuts it at or cannot decode: then a parser's error quotes (a piece of) it, and must not
    be shown."""
    start, at = url.find("//"), url.rfind("@")
    password = url[start + 2 : at].partition(":")[2] if 0 <= start < at else ""
    # a '%' that is not an escape, or one decoding to NUL, and libpq quotes the whole password
    return any(c in password for c in "#?/@") or _BAD_ESCAPE.search(password) is not None


#: ``durable_store_url`` (and ``durable_result_push``, a ``redis://`` URL may hold a password) under
#: any namespace (``CELERY_DURABLE_STORE_URL``), any case
_STORE_URL_KEY = re.compile(r"(?i)(?:^|_)durable_(?:store_url|result_push)$")


def censor_conf(table: Mapping[Any, Any]) -> dict[Any, Any]:
    """A Celery config table with every store URL passed through :func:`redact_url`.

    Celery censors settings by *name* (``celery.app.utils.HIDDEN_SETTINGS``: KEY, SECRET,
    PASS...); ``durable_store_url`` matches none, yet a ``cosmos://`` URL may carry the account
    key. The Celery glue adds this to Celery's filter (``celery report``, ``celery inspect conf``).
    """
    return {
        key: redact_url(value)
        if isinstance(key, str) and isinstance(value, str) and _STORE_URL_KEY.search(key)
        else value
        for key, value in table.items()
    }


@dataclass(frozen=True)
class Settings:
    """Every ``durable_*`` setting, typed and validated once."""

    #: where state lives: ``sqlite:///path``; ``postgresql://user:password@host:5432/db`` (or ``postgres://``;
    #: ``pip install celery-durable[postgres]``; query: ``table=`` (default ``durable_docs``), ``schema=``,
    #: ``pool_max=`` (10), ``connect_timeout=`` (10 s), any libpq parameter such as ``sslmode=require``; tables
    #: created on first use); ``cosmos://host:port/?database=…&container=…``; ``memory://`` (unit tests).
    #: The default is ``$DURABLE_STORE_URL`` if set, else ``sqlite:///celery_durable.db``
    store_url: str = field(default_factory=lambda: os.environ.get("DURABLE_STORE_URL", DEFAULT_STORE_URL), repr=False)
    #: extra backend options (e.g. the Cosmos key, or ``DURABLE_COSMOS_KEY``; SQLite ``busy_timeout``, ``file_mode``)
    store_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: lease of a running activity attempt / contended drive
    lease_ttl: float = 30.0
    #: lease renewal cadence; must be shorter than ``lease_ttl``
    heartbeat_interval: float = 10.0
    #: beat: re-drive lapsed executions, re-send lost/lapsed activities
    recovery_interval: float = 15.0
    #: beat: fire due timers
    clock_interval: float = 1.0
    #: an activity message not picked up this long after sending is considered lost (and re-sent)
    activity_queue_timeout: float = 300.0
    #: an execution that needs a drive and got none this long is re-driven by recovery
    drive_timeout: float = 30.0
    #: timers up to this also get a countdown task; 0 = beat only
    timer_fast_path_max: float = 60.0
    #: beat runs the recovery, timer and outbox scans and the workflow schedules
    install_beat: bool = True
    #: the scans run inside the beat process, which sends only the drives and re-sends they find
    #: (an idle system sends no message); False: beat sends them as tasks
    #: (``celery_durable.recover``, ``.fire_due_clocks``, ``.outbox_scan``) for a worker to run
    scans_in_beat: bool = True
    #: how long before an execution whose workflow is unknown here is tried again
    unknown_retry_delay: float = 60.0
    #: times an activity may be lost (worker killed) before it is failed
    max_lost_attempts: int = 10
    #: bytes (compact JSON) of the largest document stored (64 MiB): past the store's 2 MB item limit, payloads
    #: (inputs, results, signal values, effect payloads) are offloaded into chunk documents of the execution's
    #: partition; past this, the activity or workflow fails with ``PayloadTooLarge`` (``start()``/``signal()``
    #: raise it)
    max_payload: int = 64 * 1024 * 1024
    #: conflicts tolerated in optimistic drives before taking the exec lease
    optimistic_attempts: int = 2
    #: an activity's inline drive reuses the partition read at its start if younger than this
    trust_cache_for: float = 2.0
    #: suspended workflow instances kept alive per worker thread, resumed with only the new outcomes instead of
    #: replayed from the top when their history is unchanged (any other change to their history: a full replay;
    #: 0: always replay; off under gevent/eventlet)
    sticky_cache_size: int = 256
    #: ``start()`` runs the workflow's first drive in the caller when all it does is schedule
    #: activities or timers, and sends those itself: one broker hop fewer (see "Eager start")
    eager_start: bool = False
    #: a worker that finishes an activity runs the next one its drive schedules itself, instead
    #: of sending it, up to this many in a row (0: off; see "Eager activities"): on by default,
    #: it is still a Celery task to Flower, revoke and shutdown (glue/pool_board.py)
    eager_activities: int = 16
    #: beat: lost effect messages, due retries, expired leases
    outbox_scan_interval: float = 5.0
    #: succeeded/cancelled effect rows are deleted after this (failed rows are kept); dedupe by ``effect_id`` lasts
    #: as long
    outbox_retention: float = 7 * 24 * 3600.0
    #: an unclaimed effect row is re-sent after this
    outbox_queue_timeout: float = 60.0
    #: how often a running handler checks for a cancel
    outbox_cancel_poll: float = 1.0
    #: effect delays up to this get a countdown message; longer ones wait for the scan
    outbox_fast_send_max: float = 60.0
    #: an emitted effect (or a transactional enqueue) not admitted by its caller is admitted by the scan after this
    outbox_admit_grace: float = 10.0
    #: live (pending/running) effects per key
    outbox_max_lane_backlog: int = 10_000
    #: a delivery that settles a row runs the key's next row (same type, due now) itself, up to
    #: this many in a row, before it hands the key back to the queue (0: one row per message)
    outbox_drain_max: int = 50
    #: a worker serves Prometheus ``/metrics`` on this port (celery_durable.metrics,
    #: ``pip install celery-durable[prometheus]``; None: off); a bad or busy port stops the worker before it is ready
    metrics_port: int | None = None
    #: how handle.result() learns an execution ended: "auto" (a PostgreSQL store's LISTEN/NOTIFY, sent in the
    #: commit's transaction, else Redis pub/sub on the Celery result backend or broker if Redis, else polling),
    #: "off" (polling), or a redis:// URL to publish and subscribe there
    result_push: str = field(default="auto", repr=False)  # a URL may hold a password
    #: the longest interval between the store reads of a waiter that polls (no push; every 5% of the time waited,
    #: from 1 ms)
    result_poll_max: float = 0.05
    #: a waiter that gets pushes still re-reads the store this often (a notification is only a hint: a lost one)
    result_push_recheck: float = 2.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "int") and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ConfigurationError(f"{PREFIX}{f.name} must be a number, got {value!r}")
            if f.type == "int" and not isinstance(value, int):
                raise ConfigurationError(f"{PREFIX}{f.name} must be a whole number, got {value!r}")
            if f.type == "float" and not math.isfinite(value):
                raise ConfigurationError(f"{PREFIX}{f.name} must be a finite number, got {value!r}")
            if f.type == "bool" and not isinstance(value, bool):
                raise ConfigurationError(f"{PREFIX}{f.name} must be true or false, got {value!r}")
            if f.type in ("float", "int") and (value < 0 or (value == 0 and f.name not in _MAY_BE_ZERO)):
                raise ConfigurationError(f"{PREFIX}{f.name} must be > 0, got {value!r}")
        push = self.result_push
        if not isinstance(push, str) or not (push in PUSH_MODES or push.startswith(REDIS_SCHEMES)):
            shown = redact_url(push) if isinstance(push, str) else push
            raise ConfigurationError(f'{PREFIX}result_push must be "auto", "off" or a redis:// URL, got {shown!r}')
        if not isinstance(self.store_url, str) or not self.store_url:
            raise ConfigurationError(f"{PREFIX}store_url must be a non-empty string")
        if self.heartbeat_interval >= self.lease_ttl:
            raise ConfigurationError(
                f"{PREFIX}heartbeat_interval ({self.heartbeat_interval}) must be shorter than "
                f"{PREFIX}lease_ttl ({self.lease_ttl})"
            )

    @property
    def store_url_redacted(self) -> str:
        """The store URL safe to log or show (keys and passwords as ``***``)."""
        return redact_url(self.store_url)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"Settings(store_url={redact_url(self.store_url)!r}, {shown})"

    @classmethod
    def from_conf(cls, conf: Any, **overrides: Any) -> Settings:
        """Read ``durable_*`` keys from a Celery config (a mapping); ``overrides`` win.

        Raises :class:`ConfigurationError` for an unknown key (with the closest known one).
        """
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, name in _durable_keys(conf):
            if name not in known:
                raise ConfigurationError(_unknown(key, name))
            value = conf.get(key)
            if value is not None:
                values[name] = value
        for name, value in overrides.items():
            if name not in known:
                raise ConfigurationError(_unknown(PREFIX + name, name))
            if value is not None:
                values[name] = value
        for name, value in list(values.items()):
            values[name] = _coerce(known[name].type, name, value)
        return cls(**values)


#: the name the public API has always used
DurableSettings = Settings


def _durable_keys(conf: Any) -> list[tuple[str, str]]:
    """``(key, field name)`` of every ``durable_*`` key of ``conf``, namespaced ones last (they win).

    Under ``config_from_object(..., namespace="CELERY")`` (Django) Celery reads its own keys as
    ``CELERY_<key>``, and so must we: skipping ``CELERY_DURABLE_STORE_URL`` would silently give
    this process the default store.
    """
    keys = [k for k in (conf.keys() if hasattr(conf, "keys") else ()) if isinstance(k, str)]
    namespace = str(getattr(conf, "prefix", None) or "").lower()  # set once the keys were read
    plain: list[tuple[str, str]] = []
    namespaced: list[tuple[str, str]] = []
    for key in keys:
        lowered = key.lower()
        if namespace and lowered.startswith(namespace + PREFIX):
            namespaced.append((key, lowered[len(namespace) + len(PREFIX) :]))
        elif lowered.startswith(PREFIX):
            plain.append((key, lowered[len(PREFIX) :]))
    return plain + namespaced


def _unknown(key: str, name: str) -> str:
    """The message for an unknown ``key`` (``name``: what follows ``durable_``, namespace removed),
    the closest known key spelled as the user spells keys: ``CELERY_DURABLE_STORE_URL`` for a
    Django setting, ``durable_store_url`` for a Celery one."""
    names = [PREFIX + f.name for f in fields(Settings)]
    close = difflib.get_close_matches(PREFIX + name.lower(), names, n=1, cutoff=0.6)
    if not close:
        return f"unknown setting {key!r} (known: {', '.join(names)})"
    head = key[: len(key) - len(name)] if key.lower().endswith(name.lower()) else PREFIX
    field = close[0][len(PREFIX) :]
    mine = head + (field.upper() if key.isupper() else field)
    also = "" if mine == close[0] else f" ({close[0]})"
    return f"unknown setting {key!r}; did you mean {mine!r}{also}?"


def _coerce(kind: Any, name: str, value: Any) -> Any:
    if kind == "float":
        if isinstance(value, timedelta):
            return value.total_seconds()
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ConfigurationError(f"{PREFIX}{name} must be a number of seconds, got {value!r}") from None
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
    if kind == "int" and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if kind == "bool" and isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return lowered in ("1", "true", "yes", "on")
    return value
