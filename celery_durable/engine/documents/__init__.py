"""The documents of an execution's partition: their ids, types and statuses (``schema``), the
fields of each as a type, with accessors for what an absent field means (``records``), the
shape checks that catch a malformed one where it is read (``checks``), small shared helpers and
constants (``model``) and search attributes and memo (``search``). Everything else of the engine
reads and writes documents through these names.
"""
