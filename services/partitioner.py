"""Kafka's default partitioning, so a key lands on the partition a Kafka client would pick.

Shared by the gateway (typed produce requests) and the SDK (the producer picks partitions
itself), so both place a key where the other -- and a Kafka client -- would.

* explicit partition: used as is (validated by the caller);
* key present: ``toPositive(murmur2(key)) % partition_count`` -- Kafka's ``Utils.murmur2`` (seed
  0x9747b28c, 32-bit signed arithmetic) and ``toPositive`` (``& 0x7fffffff``);
* null key: a sticky partition, kept until the caller finishes a batch (``on_new_batch``), as
  Kafka's sticky partitioner does since KIP-480, so null-key records still batch well.
"""

from __future__ import annotations

import random
from array import array

from services.records.columns import binary_items
from services.records.record import speedups as _speedups

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def py_murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit signed hash of ``data`` (the reference; ``murmur2``
    is the C accelerator's when it is built)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for (k,) in _iter_words(data, tail):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _iter_words(data: bytes, end: int):
    import struct

    return struct.iter_unpack("<I", data[:end])


#: Kafka's ``Utils.murmur2`` of any bytes-like key: ``services/records/_speedups.c``'s (a keyed
#: record hashed in ~0.1 us instead of 1.5-4 us) unless it is not built or
#: ``TRIBUTARY_NO_EXTENSIONS`` is set, then :func:`py_murmur2`.
#: (An accelerator built before it had murmur2 -- a stale in-place build -- falls back too.)
murmur2 = getattr(_speedups, "murmur2", None) or py_murmur2


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partition_count


def py_partition_keys(count: int, keys: tuple, partition_count: int) -> bytes:
    """:func:`partition_for_key` of each of ``count`` keys of an Arrow binary column given as
    ``(validity, offsets, data)`` buffers, as int32 bytes (little-endian), -1 for a null key: the
    reference for the Spark sink's ``partition_keys`` (C with the accelerator)."""
    out = array(
        "i",
        (-1 if k is None else partition_for_key(k, partition_count) for k in binary_items(keys, count)),
    )
    if array("H", [1]).tobytes() == b"\x00\x01":  # Arrow is little-endian
        out.byteswap()
    return out.tobytes()


class StickyPartitioner:
    """Null-key records stick to one partition per topic until a batch completes.

    Not thread-safe; each gateway request handler or producer owns one.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, partition_count: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= partition_count:
            current = self._rng.randrange(partition_count)
            self._current[topic] = current
        return current

    def on_new_batch(self, topic: str, partition_count: int, previous: int) -> None:
        """Move to another partition after ``previous`` got a full batch (never the same one)."""
        if partition_count <= 1:
            return
        choice = self._rng.randrange(partition_count - 1)
        self._current[topic] = choice if choice < previous else choice + 1


#: ``py_partition_keys``, in C when the accelerator is built.
partition_keys = py_partition_keys if _speedups is None else _speedups.partition_keys
