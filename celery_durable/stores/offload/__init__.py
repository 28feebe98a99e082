"""Large documents offloaded into chunk documents of their partition: the wrapper store
(``store``), chunk ids and manifests (``chunks``) and the collector of orphan chunks (``chunk_gc``).
"""
