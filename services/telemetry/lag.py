"""Consumer lag per group and partition: a registry the consumer-group code feeds, read by the
``tributary.consumer.lag`` gauge at each collection.

Two ways to feed it, both cheap enough for the group code's own loop:

* push: :func:`record_consumer_lag` (group, topic, partition, lag) whenever the lag is known --
  after a commit, or on the periodic lag computation -- and :func:`forget_consumer_lag` when a
  group (or one of its partitions) goes away, so the series stops;
* pull: :func:`register_consumer_lag_source` with a function returning ``(group, topic,
  partition, lag)`` tuples, called at each collection; the returned callable unregisters it.

Thread-safety: collection happens on the exporter's thread (the Prometheus HTTP thread, the
periodic reader's thread), not the event loop. The registry is guarded by a lock; a pull source
runs on that thread too, so it must only read plain data (a dict the loop updates), never await
or call etcd.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

LagSample = tuple[str, str, int, int]  # group, topic, partition, lag (records)
LagSource = Callable[[], Iterable[LagSample]]


class ConsumerLagRegistry:
    """The latest lag of every (group, topic, partition) pushed here, plus pull sources."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str, int], int] = {}
        self._sources: list[LagSource] = []
        self._lock = threading.Lock()

    def record(self, group: str, topic: str, partition: int, lag: int) -> None:
        with self._lock:
            self._values[(group, topic, partition)] = lag

    def forget(self, group: str, topic: str | None = None, partition: int | None = None) -> None:
        """Drop a group's series (all of them, one topic's, or one partition's)."""
        with self._lock:
            for key in [
                k
                for k in self._values
                if k[0] == group and topic in (None, k[1]) and partition in (None, k[2])
            ]:
                del self._values[key]

    def add_source(self, source: LagSource) -> Callable[[], None]:
        with self._lock:
            self._sources.append(source)

        def remove() -> None:
            with self._lock:
                if source in self._sources:
                    self._sources.remove(source)

        return remove

    def samples(self) -> list[LagSample]:
        """Every pushed value, then every source's (a failing source is logged and skipped)."""
        with self._lock:
            pushed = [(g, t, p, lag) for (g, t, p), lag in self._values.items()]
            sources = list(self._sources)
        for source in sources:
            try:
                pushed.extend(source())
            except Exception:
                log.exception("consumer lag source %r failed", source)
        return pushed

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._sources.clear()


#: The process's registry: what :func:`record_consumer_lag` feeds and the gauge reads.
CONSUMER_LAG = ConsumerLagRegistry()


def record_consumer_lag(group: str, topic: str, partition: int, lag: int) -> None:
    """Report ``group``'s lag on ``topic``-``partition``: log end offset minus committed offset."""
    CONSUMER_LAG.record(group, topic, partition, lag)


def forget_consumer_lag(group: str, topic: str | None = None, partition: int | None = None) -> None:
    """Stop reporting a group (or one topic / partition of it): deleted, emptied, unassigned."""
    CONSUMER_LAG.forget(group, topic, partition)


def register_consumer_lag_source(source: LagSource) -> Callable[[], None]:
    """Pull lag at each collection from ``source()``; returns the function that unregisters it."""
    return CONSUMER_LAG.add_source(source)
