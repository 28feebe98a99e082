"""Replay: history in, commands out (docs/architecture.md §6). ``history`` runs a workflow function
against its recorded steps; ``context`` is the workflow's view (``wf.*`` calls land there) and
``futures`` what a durable call returns; ``decoded`` caches decoded results, ``sticky`` keeps a
suspended instance to resume instead of replaying, ``versioning`` is ``wf.patched``, ``queries``
reads a workflow's state without changing it.
"""
