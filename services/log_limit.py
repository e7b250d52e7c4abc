"""Rate-limited logging of a message that repeats: one line, then a count of the repeats.

A retry loop that logs every attempt floods the log while the thing it waits for is down -- a
storage node wrote a warning every 0.5 s per retry loop through an etcd outage. With
:class:`RepeatedLog` the first occurrence is logged at once, the repeats within ``interval_s``
are only counted, and the next line after the interval carries the count::

    etcd not reachable to re-register (...); retrying
    etcd not reachable to re-register (...); retrying (39 more in the last 20s)

When the condition is over, :meth:`RepeatedLog.ended` writes the count still pending (so no
repeat goes unreported) and forgets the message, so a new outage is logged at once again.

Messages are told apart by their format string (or an explicit ``key``), not by their arguments:
the repeats of one condition differ in details (an exception's text) and must still count as one.
Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Default: at most one line per message per this many seconds.
DEFAULT_INTERVAL_S = 30.0


@dataclass
class _Window:
    started: float
    level: int
    msg: str
    args: tuple
    repeats: int = 0


class RepeatedLog:
    """Logs through ``logger``, each distinct message at most once per ``interval_s``."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: object, key: str | None = None) -> bool:
        """Log ``msg % args`` unless it was logged less than ``interval_s`` ago; True if logged."""
        key = msg if key is None else key
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.started < self.interval_s:
                window.repeats += 1
                window.level, window.msg, window.args = level, msg, args
                return False
            self._windows[key] = _Window(now, level, msg, args)
        if window is not None and window.repeats:
            self._emit(level, msg, args, window.repeats, now - window.started)
        else:
            self.logger.log(level, msg, *args)
        return True

    def debug(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.DEBUG, msg, *args, key=key)

    def info(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.INFO, msg, *args, key=key)

    def warning(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.WARNING, msg, *args, key=key)

    def error(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.ERROR, msg, *args, key=key)

    def ended(self, key: str | None = None) -> None:
        """The condition behind ``key`` (every message when None) is over: log the repeats not
        reported yet, and log the next occurrence at once."""
        now = self._clock()
        with self._lock:
            if key is None:
                windows = list(self._windows.values())
                self._windows.clear()
            else:
                window = self._windows.pop(key, None)
                windows = [window] if window is not None else []
        for window in windows:
            if window.repeats:
                self._emit(window.level, window.msg, window.args, window.repeats, now - window.started)

    def _emit(self, level: int, msg: str, args: tuple, repeats: int, seconds: float) -> None:
        self.logger.log(level, f"{msg} (%d more in the last %.0fs)", *args, repeats, seconds)
