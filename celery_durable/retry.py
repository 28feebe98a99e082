"""Retry policy as data (like Temporal's ``RetryPolicy``), used by the effect outbox."""

from __future__ import annotations

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
        seconds = self.initial_interval.total_seconds() * self.backoff_coefficient ** max(0, attempt - 1)
        return timedelta(seconds=min(seconds, self.maximum_interval.total_seconds()))

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        """Whether a failure of attempt ``attempt`` gets another try."""
        return attempt < self.maximum_attempts and not isinstance(exc, self.non_retryable)
