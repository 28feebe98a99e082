"""``celery -A proj durable …``: the operator's command line (entry point ``celery.commands``).

``commands`` holds the group and its commands, ``cosmos`` the Cosmos container sub-group,
``render`` the terminal tables, ``operator_actions`` what ``show`` prints of recorded operations.
"""

from typing import Any

from celery_durable._moved import moved_attr

#: the names of the module this package replaced (issue 24), still found here
OLD_NAMES = frozenset({"durable", "parse_age"})
#: a star import binds them as it did
__all__ = sorted(OLD_NAMES)


def __getattr__(name: str) -> Any:
    return moved_attr(__name__, name, "celery_durable.cli.commands", OLD_NAMES)
