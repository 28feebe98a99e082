"""kombu's ``filesystem://`` transport with atomic writes, public path for ``broker_transport =
"celery_durable.contrib.filesystem:Transport"``; defined in :mod:`celery_durable.glue.filesystem_transport`.
"""

from celery_durable.glue.filesystem_transport import (
    Channel,
    Transport,
)

__all__ = [
    "Channel",
    "Transport",
]
