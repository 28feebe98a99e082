"""The operator's side (docs/architecture.md §10): ``operator`` (``Admin``: list, describe, retry,
resume, reset, purge), each action recorded with what it forgot (``oplog``, ``superseded``),
crash-safe rewrites rolled forward by whoever comes next (``pending_ops``, ``purge``), the ids a
re-run takes (``reruns``), ``reset`` and the cancel cascade it withdraws (``cancel_withdrawal``,
``child_ops``), the read model (``timeline``, ``undecodable``) and how operator tools word things
(``wording``).
"""
