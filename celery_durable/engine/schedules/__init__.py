"""Schedules as managed objects (issue 27 §1): a schedule is a document in the store, due at its
next fire time, fired by beat's clock scan (``docs/architecture.md`` §7).

``spec`` reads and checks what a user declares (an interval or a cron expression, a time zone,
jitter) and computes the ticks; ``firing`` decides what each tick does (the overlap policy, the
catch-up window, pausing on failure) and writes it, etag-guarded; ``manage`` holds the operator's
actions (create, update, delete, pause, resume, trigger, backfill).
"""
