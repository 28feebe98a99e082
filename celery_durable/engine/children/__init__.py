"""Child workflows (docs/architecture.md §7): ``links`` creates, joins, fences, cancels and notifies
the parent of a child; ``holders`` says who holds a child id (pure functions over exec documents).
"""
