"""Test and benchmark harness, not shipped in the wheel: the deterministic simulation of the
engine (``sim*``), the outbox simulation (``outbox_sim*``) and a real Cosmos account's helper
(``cosmos_account``). Used by ``tests/`` and ``bench/`` only; run from the repository root.
"""
