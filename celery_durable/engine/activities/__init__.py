"""Activities, the engine's side (docs/architecture.md §8): an attempt begins under a lease and its
outcome is recorded once (``attempts``); ``delivery`` says which delivery may complete which step;
``leases`` tracks this process's attempts and ``lease_heartbeat`` renews them all from one thread;
``local_activities`` are steps the drive runs in its own process. ``context`` is what a running
attempt says and hears (``activity.heartbeat``, cancellation), ``stalls`` watches heartbeat
deadlines, ``interrupts`` raises into a running thread.
"""
