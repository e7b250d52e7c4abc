"""``Throttler``: keeps the cleaner's I/O under ``log.cleaner.io.max.bytes.per.second``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Throttler:
    """Sleeps the calling thread so bytes reported through :meth:`maybe_throttle` average at most
    ``bytes_per_second`` since the throttler was made (shared by all cleaner threads, as
    Kafka's one throttler is). A rate of 0 or less never sleeps."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.bytes_per_second = bytes_per_second
        self._monotonic = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._window_start = monotonic()
        self._bytes = 0
        #: Seconds spent sleeping, for metrics.
        self.throttled_s = 0.0

    def maybe_throttle(self, observed_bytes: int) -> None:
        if self.bytes_per_second <= 0:
            return
        with self._lock:
            self._bytes += observed_bytes
            elapsed = self._monotonic() - self._window_start
            due = self._bytes / self.bytes_per_second - elapsed
            if elapsed > 1.0 and due <= 0:  # start a new window: idle time is not banked
                self._window_start, self._bytes = self._monotonic(), 0
        if due > 0:
            self.throttled_s += due
            self._sleep(due)
