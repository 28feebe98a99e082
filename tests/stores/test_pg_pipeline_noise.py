"""psycopg's follow-up warning about an aborted pipeline (a conflicting batch write) is dropped;
its other warnings are not (stores/postgres/connection.py ``AbortedPipelineNoise``)."""

from __future__ import annotations

import logging

import pytest
from psycopg import errors as pge

from celery_durable.stores.postgres import connection


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("psycopg", logging.WARNING, "_pipeline.py", 77, msg, args, None)


def test_the_filter_is_on_psycopgs_logger_once() -> None:
    filters = [f for f in logging.getLogger("psycopg").filters if isinstance(f, connection.AbortedPipelineNoise)]
    assert len(filters) == 1


def test_an_aborted_pipelines_follow_up_warning_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("psycopg")
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        log.warning("error ignored terminating %r: %s", "<psycopg.Pipeline>", pge.PipelineAborted("pipeline aborted"))
        log.warning("error ignored terminating %r: %s", "<psycopg.Pipeline>", pge.OperationalError("server closed"))
        log.warning("something else: %s", pge.PipelineAborted("pipeline aborted"))
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "error ignored terminating '<psycopg.Pipeline>': server closed",
        "something else: pipeline aborted",
    ]


def test_the_filter_alone() -> None:
    noise = connection.AbortedPipelineNoise()
    assert not noise.filter(_record("error ignored terminating %r: %s", "p", pge.PipelineAborted("x")))
    assert noise.filter(_record("error ignored terminating %r: %s", "p", ValueError("x")))
