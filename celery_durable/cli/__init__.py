"""``celery -A proj durable …``: the operator's command line (entry point ``celery.commands``).

``commands`` holds the group and its commands, ``cosmos`` the Cosmos container sub-group,
``render`` the terminal tables, ``operator_actions`` what ``show`` prints of recorded operations.
"""
