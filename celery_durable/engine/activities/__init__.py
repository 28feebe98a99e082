"""Activities, the engine's side (docs/architecture.md §8): an attempt begins under a lease and its
outcome is recorded once (``attempts``); ``delivery`` says which delivery may complete which step;
``leases`` tracks this process's attempts and ``lease_heartbeat`` renews them all from one thread;
``local_activities`` are steps the drive runs in its own process.
"""
