"""Retry policies as data: :class:`RetryPolicy` (like Temporal's, used by the effect outbox) and
:class:`TaskRetry` (a Celery task's automatic retry options, as a worker applies them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["RetryPolicy", "TaskRetry"]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``min(maximum_interval, initial_interval * backoff**(attempt-1))``.

    The default is the outbox's: 100 ms doubling up to 30 s, 5 attempts.
    """

    initial_interval: timedelta = timedelta(milliseconds=100)
    backoff_coefficient: float = 2.0
    maximum_interval: timedelta = timedelta(seconds=30)
    maximum_attempts: int = 5
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.maximum_attempts < 1:
            raise ValueError("maximum_attempts must be >= 1")
        if self.backoff_coefficient < 1:
            raise ValueError("backoff_coefficient must be >= 1")

    def delay(self, attempt: int) -> timedelta:
        """Delay before retrying after failed attempt number ``attempt`` (1-based)."""
        initial, cap = self.initial_interval.total_seconds(), self.maximum_interval.total_seconds()
        if initial <= 0 or initial >= cap:
            return min(self.initial_interval, self.maximum_interval)
        # capped once backoff**steps >= cap/initial: decided in log space, because the power itself
        # overflows a float long before any attempt limit (coefficient 10: attempt ~310)
        steps, growth = max(0, attempt - 1), math.log(self.backoff_coefficient)
        if growth > 0 and steps >= math.log(cap / initial) / growth:
            return self.maximum_interval
        seconds = initial * self.backoff_coefficient**steps
        return self.maximum_interval if seconds >= cap else timedelta(seconds=seconds)

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        """Whether a failure of attempt ``attempt`` gets another try."""
        return attempt < self.maximum_attempts and not isinstance(exc, self.non_retryable)


@dataclass(frozen=True)
class TaskRetry:
    """A Celery task's automatic retries (``autoretry_for``, ``max_retries`` …) as a worker runs them.

    Lets an in-process runner (the test environment) retry exactly what a worker would, as many
    times. Delays are Celery's without jitter: ``retry_backoff`` gives
    ``min(retry_backoff_max, factor * 2**retries)``, otherwise ``countdown`` (the task's
    ``default_retry_delay``, or ``retry_kwargs["countdown"]``).
    """

    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    #: retries after the first attempt; ``None``: retry forever (Celery's meaning)
    max_retries: int | None = 3
    countdown: float = 180.0
    #: backoff factor in seconds (``True`` is 1); 0: no backoff
    retry_backoff: float = 0.0
    retry_backoff_max: float = 600.0

    def next_delay(self, retries: int, exc: BaseException) -> float | None:
        """Seconds before the next attempt after ``exc`` ended the attempt that followed
        ``retries`` retries; ``None`` when Celery would not retry (the failure is final)."""
        if not isinstance(exc, self.autoretry_for) or isinstance(exc, self.dont_autoretry_for):
            return None
        if self.max_retries is not None and retries + 1 > self.max_retries:
            return None
        if self.retry_backoff:
            factor = int(max(1.0, self.retry_backoff))
            # 2**retries overflows nothing here: Python ints, capped right away
            return float(min(self.retry_backoff_max, factor * 2 ** min(retries, 64)))
        return max(0.0, float(self.countdown))
