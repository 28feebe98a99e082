"""Celery apps of the benchmarks (imported by worker subprocesses with ``bench/`` on PYTHONPATH)."""
