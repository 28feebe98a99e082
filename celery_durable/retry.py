"""Retry policy as data (like Temporal's ``RetryPolicy``), used by the effect outbox."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["RetryPolicy"]


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
