"""The serializer of the library's own Celery messages (drive, timers, activities, effects, retries).

They are sent with the app's ``task_serializer``, so an authenticating one (``app.setup_security()``:
``auth``) signs them as it signs the app's own tasks; what they carry is JSON-native in any case
(codecs.py), so ``auth`` wraps JSON. The one exception is ``pickle``: the library never sends
pickle, so it sends ``json`` then, which the app must accept (else :class:`ConfigurationError`,
raised at ``Durable(app)`` when the app is configured by then, else at the first send).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from celery_durable.errors import ConfigurationError

__all__ = ["serializer", "check", "WireTask"]

_PICKLE = frozenset({"pickle", "application/x-python-serialize"})
_JSON = frozenset({"json", "application/json"})


def serializer(app: Celery) -> str:
    """The serializer of the library's messages on ``app``: its ``task_serializer``, unless pickle."""
    name = str(app.conf.task_serializer or "json")
    if name.lower() == "auth" and _signed_inner() in _PICKLE:
        raise ConfigurationError(
            "app.setup_security(serializer='pickle') signs pickled bodies, which celery_durable never "
            "sends: call setup_security(serializer='json') (the library's messages are JSON-native)"
        )
    if name.lower() not in _PICKLE:
        return name
    accept = app.conf.accept_content
    if accept is None or any(str(a).lower() in _JSON for a in accept):  # None: kombu accepts anything
        return "json"
    raise ConfigurationError(
        "task_serializer is 'pickle', which celery_durable never sends, and accept_content "
        f"({list(accept)!r}) has no 'json' to send its messages with instead: add 'json' to "
        "accept_content or use another task_serializer (e.g. 'json', or 'auth' for signed messages)"
    )


def _signed_inner() -> str:
    """The serializer Celery's ``auth`` wraps (``setup_security(serializer=...)``), "" if unknown."""
    from kombu.serialization import registry

    codec = registry._encoders.get("auth")  # kombu keeps no public accessor for an encoder
    owner = getattr(getattr(codec, "encoder", None), "__self__", None)
    return str(getattr(owner, "_serializer", "") or "").lower()


def check(app: Celery, **_: Any) -> None:
    """Raise :class:`ConfigurationError` now if the library could not send on ``app``."""
    serializer(app)


class WireTask(Task):  # type: ignore[misc]
    """Base of the library's own tasks: their retries and beat's sends use :func:`serializer`
    (read when first sent, so a configuration made after ``Durable(app)`` counts)."""

    abstract = True

    @property
    def serializer(self) -> str:  # type: ignore[override]
        return serializer(self.app)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        # task_annotations set attributes on the task class (Task.annotate), which replaces the
        # property above: the serializer is given with every send instead
        options["serializer"] = serializer(self.app)
        return super().apply_async(args, kwargs, **options)
