"""What every service's instruments are built from: running totals, attribute caches, buckets.

Each service owns its instruments class (``storage_node/telemetry.py``,
``coordinator/telemetry.py``, ``gateway/server/telemetry.py``), built only when telemetry is on:
a service holds ``None`` instead when it is off, so the hot paths pay one ``is None`` test and
nothing else. When on, recording is per partition batch, never per record, and as cheap as we
could make it:

* per-topic counters (records and bytes appended, fetched) are :class:`RunningTotals`: plain
  ints bumped on the hot path (~0.1 us) and reported by an *observable* counter at collection
  time -- an SDK ``Counter.add`` costs ~5 us per call (measurement object, attribute hashing,
  locks), which was 11 us per append for two of them;
* gauges over state that already exists (log end offsets, log sizes, fetch-port counters, the
  coordinator's metadata cache, consumer lag) are observed at collection time: free;
* histograms (batch sizes, call durations) and spans are recorded directly: at most one span per
  append, one histogram point per partition batch or RPC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from services.telemetry import names

#: Batch-size buckets (bytes): 1 KiB .. 16 MiB in powers of 4 (the gateway caps batches at 1 MiB
#: by default, max.message.bytes may allow more).
BATCH_BYTES_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
BATCH_RECORDS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class TopicAttributes(dict):
    """topic -> ``{"messaging.destination.name": topic}``, built once per topic."""

    def __missing__(self, topic: str) -> dict:
        value = self[topic] = {names.MESSAGING_DESTINATION_NAME: topic}
        return value


def partition_attributes(topic: str, partition: int) -> dict:
    """The attributes of one partition's data points."""
    return {names.MESSAGING_DESTINATION_NAME: topic, names.MESSAGING_DESTINATION_PARTITION_ID: str(partition)}


class RunningTotals:
    """Monotonic sums per key, kept in plain ints and reported by an observable counter.

    ``add`` runs on the event loop; the callback runs on the exporter's thread and copies the
    dict first (``list(dict.items())`` does not release the GIL, so it never sees a half-made
    change; a value one add behind is fine for a counter).
    """

    def __init__(
        self, meter, name: str, *, unit: str, description: str, attributes: Callable[[Any], dict]
    ) -> None:
        self._sums: dict = {}
        self._attributes = attributes
        meter.create_observable_counter(name, [self._observe], unit=unit, description=description)

    def add(self, key, amount: int) -> None:
        sums = self._sums
        sums[key] = sums.get(key, 0) + amount

    def _observe(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(total, self._attributes(key)) for key, total in list(self._sums.items())]
