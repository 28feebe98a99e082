"""What the Celery glue modules need of a ``Durable`` extension, without importing it.

``app.Durable`` builds the tasks, the outbox and the receivers; they in turn only need a few of
its members at run time. Typing them against this protocol (and finding the extension of an app
with :func:`durable_of`) keeps the imports one way: ``app`` → ``tasks``/``outbox``/``durable_activity``/
``hook_receivers`` → here, never back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

    from celery_durable.engine.core import Engine
    from celery_durable.engine.registry import Registry
    from celery_durable.settings import Settings

__all__ = ["DurableLike", "durable_of", "EXTENSION_ATTR"]

#: where ``Durable(app)`` leaves itself on the Celery app
EXTENSION_ATTR = "_celery_durable"


class DurableLike(Protocol):
    app: Celery
    registry: Registry

    @property
    def engine(self) -> Engine:
        """The engine of this process (built on first use)."""
        ...

    @property
    def engine_if_built(self) -> Engine | None:
        """The engine if this process built one already (never builds it)."""
        ...

    @property
    def settings(self) -> Settings: ...

    def reset_after_fork(self) -> None: ...

    def shutdown(self) -> None: ...


def durable_of(app: Any) -> DurableLike:
    """The ``Durable`` extension installed on a Celery app (``Durable(app)``)."""
    durable = getattr(app, EXTENSION_ATTR, None)
    if durable is None:
        name = getattr(app, "main", app)
        raise ConfigurationError(f"Celery app {name!r} has no Durable extension: call Durable(app)")
    return durable  # type: ignore[no-any-return]
