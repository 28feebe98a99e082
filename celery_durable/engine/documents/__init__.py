"""The documents of an execution's partition: their ids, types and statuses (``schema``), the
shape checks that catch a malformed one where it is read (``checks``), small shared helpers and
constants (``model``) and search attributes and memo (``search``). Everything else of the engine
reads and writes documents through these names.
"""
