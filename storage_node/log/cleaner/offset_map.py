"""``OffsetMap``: the cleaner's bounded key -> latest offset map (Kafka's ``SkimpyOffsetMap``).

Keys are stored as 16-byte BLAKE2b digests, not as themselves, so an entry costs the same
whatever the key's size, and the map's capacity is fixed up front from the
``log.cleaner.dedupe.buffer.size`` budget: ``budget / ENTRY_BYTES`` entries (a 16-byte digest and
an 8-byte offset, as Kafka counts), times Kafka's load factor of 0.9. Python's dict costs more per
entry than those 24 bytes (about 5x); the budget bounds the *number* of entries, which is what
keeps memory bounded however many distinct keys a partition holds. Two distinct keys sharing a
128-bit digest (about 2^-64 for 2^32 keys) would make the cleaner drop the older one's record;
Kafka accepts the same odds with MD5.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib

#: Bytes per entry as the budget counts them: a 16-byte digest and an 8-byte offset.
ENTRY_BYTES = 24
#: Kafka's log.cleaner.io.buffer.load.factor default.
LOAD_FACTOR = 0.9
_DIGEST_SIZE = 16


def key_digest(key: bytes) -> bytes:
    """The 16-byte digest a key is stored under."""
    return hashlib.blake2b(key, digest_size=_DIGEST_SIZE).digest()


class OffsetMap:
    """Key digest -> the largest offset seen for that key, holding at most :attr:`capacity` keys."""

    def __init__(self, memory_bytes: int) -> None:
        if memory_bytes < ENTRY_BYTES:
            raise ValueError(f"an offset map needs at least {ENTRY_BYTES} bytes, got {memory_bytes}")
        #: Distinct keys the map may hold.
        self.capacity = max(1, int(memory_bytes // ENTRY_BYTES * LOAD_FACTOR))
        self._offsets: dict[bytes, int] = {}
        #: The largest offset put, -1 when empty.
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def full(self) -> bool:
        return len(self._offsets) >= self.capacity

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as the latest for ``key``; False (nothing changed) when ``key`` is
        new and the map is full. Offsets must be put in increasing order."""
        digest = key_digest(key)
        if digest not in self._offsets and len(self._offsets) >= self.capacity:
            return False
        self._offsets[digest] = offset
        if offset > self.latest_offset:
            self.latest_offset = offset
        return True

    def contains(self, key: bytes) -> bool:
        return key_digest(key) in self._offsets

    def get(self, key: bytes) -> int:
        """The latest offset put for ``key``, or -1."""
        return self._offsets.get(key_digest(key), -1)

    def clear(self) -> None:
        self._offsets.clear()
        self.latest_offset = -1
