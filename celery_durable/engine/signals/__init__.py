"""Workflow signals (values sent *to* an execution; not the Celery-style hooks of
``celery_durable.signals``): ``inbox`` records a sent value with the exec and emits what a replay
rejected; ``channels`` waits on several names; ``external`` carries out ``wf.signal_external``.
"""
