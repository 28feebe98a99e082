"""Durable timers (docs/architecture.md §7): a due clock fires by *creating* its outcome document, so
the fast-path countdown and beat's scan converge on one outcome (``clocks``).
"""
