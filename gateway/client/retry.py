"""When to retry and how long to wait: a pure policy shared by the producer and the consumer.

Kafka's rules (KIP-580): the wait before retry *n* is ``retry_backoff_ms * 2**(n-1)``, capped at
``retry_backoff_max_ms``, with +-20% jitter so many clients that failed together do not retry
together. A producer batch is retried only for a retriable error, at most ``retries`` times, and
never after ``delivery_timeout_ms`` has passed since the batch was created (Kafka's bound on the
total time a record may take, retries included).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from services.errors import TributaryError

JITTER = 0.2


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff and retry limits. Pure: pass ``now_ms``; the RNG is injectable for tests."""

    retries: int = 2**31 - 1
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    delivery_timeout_ms: int = 120_000
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.retries < 0 or self.retry_backoff_ms < 0 or self.delivery_timeout_ms <= 0:
            raise ValueError("retries and retry_backoff_ms must be >= 0, delivery_timeout_ms > 0")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            object.__setattr__(self, "retry_backoff_max_ms", self.retry_backoff_ms)

    def backoff_ms(self, attempt: int) -> int:
        """The wait before retry number ``attempt`` (1 = the first retry), jittered."""
        if self.retry_backoff_ms == 0:
            return 0
        exponent = min(max(attempt, 1) - 1, 32)  # 2**32 * backoff is past any cap already
        base = min(self.retry_backoff_max_ms, self.retry_backoff_ms * 2**exponent)
        jittered = base * (1 + self.rng.uniform(-JITTER, JITTER))
        return max(0, int(min(jittered, self.retry_backoff_max_ms)))

    def is_expired(self, created_ms: int, now_ms: int) -> bool:
        """True once ``delivery_timeout_ms`` has passed since ``created_ms``."""
        return now_ms - created_ms >= self.delivery_timeout_ms

    def can_retry(self, error: TributaryError, attempts: int, created_ms: int, now_ms: int) -> bool:
        """Whether a batch that failed with ``error`` after ``attempts`` sends may be sent again."""
        return (
            getattr(error, "retriable", False)
            and attempts <= self.retries
            and not self.is_expired(created_ms, now_ms)
        )
