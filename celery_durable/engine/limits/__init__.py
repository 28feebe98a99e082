"""Keyed concurrency and rate limits across all workers (issue 26 §1).

``spec`` is what a user declares (:class:`~.spec.Limit`) and what a step records of it at
scheduling (its key, priority and fairness group); ``table`` decides, as a pure function of one
limit document, who holds a slot and who is granted one next; ``slots`` keeps those documents in
the store (etag-guarded, one per limit and key) for the attempts that begin and end.
"""
