"""``Durable(app)``: the extension object that binds celery_durable to a Celery app."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar, overload

from celery import Celery

from . import workflow as _wf
from .engine.context import current_context
from .engine.core import Engine
from .engine.registry import Registry, WorkflowDef
from .errors import ConfigurationError
from .handle import WorkflowHandle
from .settings import DurableSettings
from .signals.receivers import forward_event, install
from .stores import Store, store_from_url
from .tasks import RECOVER_TASK, CeleryDispatcher, register_tasks

__all__ = ["Durable", "Workflow"]

P = ParamSpec("P")
R = TypeVar("R")

_ATTR = "_celery_durable"


class Workflow(Generic[P, R]):
    """A workflow function registered with a :class:`Durable`.

    ``start()`` runs it durably on the workers; calling it directly outside a workflow just
    runs the function (handy in unit tests of business logic).
    """

    def __init__(self, durable: Durable, definition: WorkflowDef) -> None:
        self._durable = durable
        self.definition = definition
        self.name = definition.name
        self.__wrapped__ = definition.fn
        self.__doc__ = definition.fn.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if current_context() is not None:
            raise NotImplementedError("child workflows arrive with the children issue; use start() outside")
        result: R = self.definition.fn(*args, **kwargs)
        return result

    def start(self, *args: Any, _workflow_id: str | None = None, **kwargs: Any) -> WorkflowHandle[R]:
        """Start (or join, when ``_workflow_id`` exists) an execution; validate in the caller."""
        eid, _ = self._durable.engine.start(self.definition, args, kwargs, workflow_id=_workflow_id)
        return WorkflowHandle(self._durable.engine, eid, self.definition)

    def handle(self, workflow_id: str) -> WorkflowHandle[R]:
        return WorkflowHandle(self._durable.engine, workflow_id, self.definition)


class Durable:
    """Durable workflows on a Celery app: ``durable = Durable(app)``.

    Settings come from ``app.conf`` keys prefixed ``durable_`` (see :mod:`celery_durable.settings`);
    keyword arguments override them. ``store`` may be a URL or a :class:`Store`.
    """

    def __init__(self, app: Celery, store: Store | str | None = None, **settings: Any) -> None:
        if getattr(app, _ATTR, None) is not None:
            raise ConfigurationError("this Celery app already has a Durable extension")
        self.app = app
        self._overrides = settings
        self._store_arg = store
        self.registry = Registry()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        setattr(app, _ATTR, self)
        register_tasks(app, self)
        install(self)
        app.on_after_configure.connect(self._install_beat, weak=False)

    @staticmethod
    def of(app: Celery) -> Durable:
        durable = getattr(app, _ATTR, None)
        if durable is None:
            raise ConfigurationError(f"Celery app {app.main!r} has no Durable extension: call Durable(app)")
        return durable  # type: ignore[no-any-return]

    # --- lazily built, per process ------------------------------------------------------

    @property
    def settings(self) -> DurableSettings:
        return DurableSettings.from_conf(self.app.conf, **self._overrides)

    @property
    def engine(self) -> Engine:
        engine = self._engine
        if engine is None:
            with self._lock:
                if self._engine is None:
                    settings = self.settings
                    store = self._store_arg
                    if store is None or isinstance(store, str):
                        store = store_from_url(store or settings.store_url, **settings.store_options)
                    self._store_arg = store
                    engine = Engine(store, CeleryDispatcher(self.app), self.registry, settings.engine_settings())
                    engine.subscribe(forward_event)
                    self._engine = engine
                engine = self._engine
        return engine

    @property
    def store(self) -> Store:
        return self.engine.store

    def configure(self, store: Store | str | None = None, **settings: Any) -> None:
        """Change the store and/or settings of this process (tests, scripts); rebuilds the engine."""
        with self._lock:
            if self._engine is not None:
                self._engine.leases.stop(release=True)
            self._engine = None
            self._store_arg = store
            self._overrides = {**self._overrides, **settings}

    def reset_after_fork(self) -> None:
        with self._lock:
            if isinstance(self._store_arg, Store):
                self._store_arg.reopen()
            if self._engine is not None:
                self._engine.cache.invalidate()

    def shutdown(self) -> None:
        engine = self._engine
        if engine is not None:
            engine.leases.stop(release=True)

    def _install_beat(self, **_: Any) -> None:
        settings = self.settings
        if not settings.install_beat:
            return
        schedule = dict(self.app.conf.beat_schedule or {})
        schedule.setdefault(
            RECOVER_TASK,
            {"task": RECOVER_TASK, "schedule": timedelta(seconds=float(settings.recovery_interval))},
        )
        self.app.conf.beat_schedule = schedule

    # --- declaring ----------------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[P, R]) -> Workflow[P, R]: ...
    @overload
    def workflow(self, *, name: str | None = None) -> Callable[[Callable[P, R]], Workflow[P, R]]: ...
    def workflow(self, fn: Any = None, *, name: str | None = None) -> Any:
        """Register a workflow function; its name (default ``module.qualname``) is stored."""

        def wrap(f: Callable[P, R]) -> Workflow[P, R]:
            wf_name = name or f"{f.__module__}.{f.__qualname__}"
            return Workflow(self, self.registry.add_workflow(wf_name, f))

        return wrap(fn) if fn is not None else wrap

    def handle(self, workflow_id: str) -> WorkflowHandle[Any]:
        """A handle to an existing execution by id."""
        return WorkflowHandle(self.engine, workflow_id)

    # --- the in-workflow API, also reachable as durable.<name> ---------------------------

    now = staticmethod(_wf.now)
    uuid4 = staticmethod(_wf.uuid4)
    random = staticmethod(_wf.random)
    gather = staticmethod(_wf.gather)
    execution_id = staticmethod(_wf.execution_id)
