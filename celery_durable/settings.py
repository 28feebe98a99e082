"""Typed settings, read from Celery config keys with a ``durable_`` prefix.

=================================  ==========================  ===============================
setting                            default                     meaning
=================================  ==========================  ===============================
``durable_store_url``              ``$DURABLE_STORE_URL`` or   where state lives
                                   ``sqlite:///celery_durable.db``
``durable_lease_ttl``              30 s                        lease lifetime (drives, attempts)
``durable_heartbeat_interval``     10 s                        lease renewal cadence (< ttl)
``durable_recovery_interval``      15 s                        beat: lapsed leases, lost messages
``durable_clock_interval``         1 s                         beat: due timers
``durable_activity_queue_timeout`` 300 s                       unstarted activity → re-sent
``durable_drive_timeout``          30 s                        undriven execution → re-driven
``durable_timer_fast_path_max``   60 s                        timers up to this get a countdown
                                                               task too (0: beat's scan only)
``durable_install_beat``           True                        add the beat entries
``durable_store_options``          {}                          extra backend options
=================================  ==========================  ===============================
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from .engine.model import Settings as EngineSettings
from .errors import ConfigurationError

__all__ = ["DurableSettings", "DEFAULT_STORE_URL"]

DEFAULT_STORE_URL = "sqlite:///celery_durable.db"


@dataclass(frozen=True)
class DurableSettings:
    store_url: str = field(default_factory=lambda: os.environ.get("DURABLE_STORE_URL", DEFAULT_STORE_URL))
    lease_ttl: float = 30.0
    heartbeat_interval: float = 10.0
    recovery_interval: float = 15.0
    clock_interval: float = 1.0
    activity_queue_timeout: float = 300.0
    drive_timeout: float = 30.0
    timer_fast_path_max: float = 60.0
    install_beat: bool = True
    store_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("lease_ttl", "heartbeat_interval", "recovery_interval", "clock_interval"):
            if float(getattr(self, name)) <= 0:
                raise ConfigurationError(f"durable_{name} must be > 0")
        if self.heartbeat_interval >= self.lease_ttl:
            raise ConfigurationError(
                f"durable_heartbeat_interval ({self.heartbeat_interval}) must be shorter than "
                f"durable_lease_ttl ({self.lease_ttl})"
            )

    @classmethod
    def from_conf(cls, conf: Any, **overrides: Any) -> DurableSettings:
        """Read ``durable_*`` keys from a Celery config (a mapping); ``overrides`` win."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = f"durable_{f.name}"
            value = conf.get(key) if hasattr(conf, "get") else None
            if value is not None:
                values[f.name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigurationError(f"unknown durable settings: {', '.join(sorted(unknown))}")
        return cls(**values)

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(
            lease_ttl=float(self.lease_ttl),
            heartbeat_interval=float(self.heartbeat_interval),
            activity_queue_timeout=float(self.activity_queue_timeout),
            drive_timeout=float(self.drive_timeout),
        )
