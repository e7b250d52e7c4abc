"""One-record batches sealed on the application's thread, inside their produce request's frame.

When a record fills its batch by itself (``batch_size`` no bigger than one record: the 2011
paper's unbatched producer, one record per request), nothing can join the batch and nothing
about it changes before it is sent -- for a producer that does not number its batches
(idempotence numbers them when they are first sent) and does not compress. The accumulator then
has :class:`RecordRequestSealer` encode the record, its batch and the raw data path's request
frame around it in one call (``_speedups.encode_record_request``; :func:`py_encode_record_request`
without the C accelerator), in the thread that calls ``send()``. The sender's routine, on the
I/O thread, only writes the frame's correlation id and queues it (``Sender._write_direct``);
any other way out (gRPC, a request of several batches, a retry) uses the batch's bytes, a view
into the frame. With one record per request the builder, the batch build and the frame
encoding were ~30% of the sender's time, and both threads take turns on one GIL.
"""

from __future__ import annotations

import struct

from services.dataport import protocol as dp
from services.records import RecordBatchBuilder
from services.records.record import speedups as _speedups

#: Where a produce request frame holds its correlation id: after its size (int32) and kind (byte).
CORRELATION_ID_AT = 5
_INT = struct.Struct(">i")
#: A partition entry's head in a produce frame: partition, length of its batches.
_PARTITION_HEAD = struct.Struct(">ii")
#: What follows the batch in the frame: an empty trace context (its int16 length).
_TRAILER_BYTES = 2


def py_encode_record_request(prefix: bytes, partition: int, timestamp: int, key, value, headers) -> bytearray:
    """The frame of a produce request of one partition holding one batch of one record (the
    reference of ``_speedups.encode_record_request``): ``prefix`` (see
    :meth:`RecordRequestSealer.prefix`; its size field is rewritten), the partition, the batch's
    length and bytes (``RecordBatchBuilder``'s), an empty trace context. Raises what the builder
    raises for a bad record."""
    builder = RecordBatchBuilder()
    builder.append(value, timestamp=timestamp, key=key, headers=headers)
    batch = builder.build()
    frame = bytearray(prefix)
    frame += _PARTITION_HEAD.pack(partition, len(batch))
    frame += batch
    frame += b"\x00" * _TRAILER_BYTES  # the trace context: an empty string
    _INT.pack_into(frame, 0, len(frame) - _INT.size)
    return frame


_c_encode_record_request = getattr(_speedups, "encode_record_request", None)  # as in futures.py


def encode_record_request(prefix: bytes, partition: int, timestamp: int, key, value, headers) -> bytearray:
    """:func:`py_encode_record_request`, in C for the common argument types."""
    if _c_encode_record_request is not None:
        frame = _c_encode_record_request(prefix, partition, timestamp, key, value, headers)
        if frame is not None:
            return frame
    return py_encode_record_request(prefix, partition, timestamp, key, value, headers)


class RecordRequestSealer:
    """Seals one-record batches in request frames for a producer's ``acks`` and request timeout.

    :meth:`seal` makes a record's frame and says where the batch lies in it.
    """

    def __init__(self, acks: int, timeout_ms: int) -> None:
        self.acks = acks
        self.timeout_ms = timeout_ms
        self._prefixes: dict[str, bytes] = {}

    def prefix(self, topic: str) -> bytes:
        """What a one-partition produce request on ``topic`` starts with, up to the partition:
        as ``dp.encode_produce_request`` writes it (correlation id 0, size to be rewritten).
        ValueError for a topic name the frame cannot carry."""
        prefix = self._prefixes.get(topic)
        if prefix is None:
            empty = dp.encode_produce_request(dp.ProduceRequest(0, self.acks, self.timeout_ms, topic, [], ""))
            # An empty request ends with its partition count (0) and the empty trace context.
            assert empty.endswith(b"\x00" * 6), "the produce frame's layout changed"
            prefix = self._prefixes[topic] = empty[:-6] + _INT.pack(1)
        return prefix

    def seal(
        self, topic: str, partition: int, timestamp: int, key, value, headers
    ) -> tuple[bytearray, int] | None:
        """The request frame and where the batch starts in it (it ends 2 bytes before the
        frame's end: :func:`batch_in`); None when no frame can carry the topic's name (the
        batch is then built as any other, and its request fails as any other would)."""
        prefix = self._prefixes.get(topic)
        if prefix is None:
            try:
                prefix = self.prefix(topic)
            except ValueError:
                return None
        frame = encode_record_request(prefix, partition, timestamp, key, value, headers)
        return frame, len(prefix) + _PARTITION_HEAD.size


def stamp_correlation_id(frame: bytearray, correlation_id: int) -> None:
    """Write the connection's correlation id into a sealed frame (sealed with 0)."""
    _INT.pack_into(frame, CORRELATION_ID_AT, correlation_id)


def batch_in(frame: bytearray, start: int) -> memoryview:
    """The batch bytes in a frame :func:`encode_record_request` made, from ``start``: a view, no
    copy. (Made when asked, not with the frame: a memoryview is two objects the garbage
    collector tracks, walked by each of its collections while the record waits.)"""
    return memoryview(frame)[start : len(frame) - _TRAILER_BYTES]
