"""The replication throttle of partition reassignment: a token bucket shared by every replica
fetcher of one node. Pure: the clock is passed in.

While a reassignment adds a replica, the replica copies the log at most at the rate the
reassignment set (Kafka's ``follower.replication.throttled.rate`` for throttled replicas), so a
move does not starve producers and in-sync followers; fetches for other partitions are never
held back. A fetch is sized to what the bucket holds; a batch larger than that still arrives
whole (fetches return at least one batch), and the debt is paid by waiting before the next.
"""

from __future__ import annotations

#: Bytes the bucket may save up: a quarter second at the rate, so a pause does not turn into a
#: burst (a fetcher holding throttled partitions back shortens its long poll to match).
BURST_S = 0.25


class CopyThrottle:
    """Bytes/s for the throttled partitions of one node, all fetchers together."""

    def __init__(self, now_ms: int) -> None:
        self.rate = 0
        self._tokens = 0.0
        self._last_ms = now_ms
        #: Throttled bytes copied so far (for metrics and tests).
        self.bytes_copied = 0

    def _refill(self, rate: int, now_ms: int) -> None:
        if rate != self.rate:
            self.rate = rate
            self._tokens = min(self._tokens, rate * BURST_S)
        elapsed = max(0, now_ms - self._last_ms) / 1000
        self._last_ms = now_ms
        self._tokens = min(self._tokens + elapsed * rate, rate * BURST_S)

    def allowance(self, rate: int, now_ms: int) -> int:
        """Bytes the throttled partitions may fetch now (0: wait)."""
        self._refill(rate, now_ms)
        return max(0, int(self._tokens))

    def consume(self, size: int) -> None:
        self._tokens -= size
        self.bytes_copied += size

    def wait_s(self) -> float:
        """How long until the bucket holds a byte again."""
        if self.rate <= 0 or self._tokens > 0:
            return 0.0
        return (1 - self._tokens) / self.rate
