"""Pushed results: a waiter is woken when an execution ends instead of polling the store.

``base`` is the seam, ``redis`` (pub/sub) and ``postgres`` (LISTEN/NOTIFY) the transports,
``selection`` picks one for a process (``durable_result_push``).
"""
