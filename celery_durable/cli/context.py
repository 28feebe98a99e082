"""The project's :class:`Durable`, found from the Celery app the ``celery -A proj`` root loaded."""

from __future__ import annotations

import click

from celery_durable.app import Durable

__all__ = ["durable_of"]


def durable_of(ctx: click.Context) -> Durable:
    root = ctx.find_root()
    app = getattr(root.obj, "app", None) if root.obj is not None else None
    if app is None:
        raise click.ClickException("no Celery app: run it as `celery -A proj durable …`")
    return Durable.of(app)
