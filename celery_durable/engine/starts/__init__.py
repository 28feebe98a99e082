"""Starts with a dedup key: one running execution per key (engine/starts/dedup.py)."""
