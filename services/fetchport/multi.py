"""The fetch port's multi-partition frames (version 1): pure encoding and decoding, no sockets.

Version 0 (``protocol.py``) fetches one partition per request. Version 1 fetches many, and says
who is fetching, so that one connection carries everything a follower copies from a leader (one
fetcher per leader, as Kafka's replica fetchers) and the leader can check leader epochs and
answer a diverging epoch (KIP-320). Consumers may use it too (``replica_id`` -1).

Every integer is big-endian. Request (client -> node)::

    size                 int32   bytes after this field
    version              int16   1
    correlation_id       int32   echoed in the response
    replica_id           int32   the fetching follower's node id; -1 for a consumer
    max_wait_ms          int32   long-poll bound; 0 answers at once
    min_bytes            int32   answer early once this many record bytes are available
    max_bytes            int32   bound on the record bytes of the whole response
    isolation_level      int8    0 read_uncommitted (to the high watermark), 1 read_committed (to
                                 the last stable offset, aborted transactions listed); followers 0
    partition_count      int32   then, per partition:
      topic_length       int16   then topic_length bytes of UTF-8
      partition          int32
      current_leader_epoch int32 the leader epoch the fetcher knows; -1 = do not check
      fetch_offset       int64
      last_fetched_epoch int32   epoch of the fetcher's last batch; -1 = none (no divergence check)
      partition_max_bytes int32  bound on this partition's record bytes (the first batch goes whole)

Response (node -> client)::

    size                 int32   bytes after this field
    correlation_id       int32
    error_code           int16   a request-level error (then partition_count is 0)
    message_length       int16   then message_length bytes of UTF-8
    partition_count      int32   then, per partition, in request order:
      topic_length       int16   then topic bytes
      partition          int32
      error_code         int16   Kafka's numeric code, 0 = none
      high_watermark     int64
      log_start_offset   int64
      log_end_offset     int64
      diverging_epoch    int32   -1 = none; else the fetcher truncates (see ``storage_node.replication``)
      diverging_end_offset int64
      last_stable_offset int64   -1 unless read_committed
      aborted_count      int32   then per aborted transaction overlapping the records:
        producer_id      int64
        first_offset     int64   (read_committed drops the producer's records from here to its
                                 ABORT marker)
      message_length     int16   then message_length bytes of UTF-8
      records_length     int32   then records_length bytes of whole RecordBatch v2 batches

Version 3 (consumers only: ``replica_id`` -1) is version 1 with a *sparse* answer, the fetch
session idea (KIP-227) applied to this hop: the gateway serves a consumer's fetch session
(``services/dataport``), knows what it last told the consumer of each partition, and sends it
along; the node then leaves out of its answer every partition with nothing new. The request
adds, per partition, after ``partition_max_bytes``::

      known_high_watermark int64  the high watermark the fetcher knows (read_committed: the last
                                  stable offset); -1 = none (the partition is always answered)
      known_log_start_offset int64  likewise

and the response lists, in request order, only the partitions with records, an error, or a high
watermark (read_committed: last stable offset) or log start offset other than the known ones.
A partition left out had nothing to read at its fetch offset and the offsets the fetcher knows.
Most partitions of a wide fetch carry nothing, so this saves a header's encoding on the node
and its decoding on the gateway for each. A node that does not speak version 3 refuses it like
any unknown version; the fetcher then asks in version 1.

The node writes each partition's records straight from its segment file with ``os.sendfile``;
this module builds and parses everything around them.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import NamedTuple

from services import errors
from services.fetchport.protocol import SIZE

MULTI_FETCH_VERSION = 1
#: Version 1 with known offsets per partition and an answer that leaves out the quiet ones.
SPARSE_FETCH_VERSION = 3
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
#: ``replica_id`` of a consumer's fetch.
CONSUMER_REPLICA_ID = -1
NO_EPOCH = -1
#: Refuse version-1 request frames larger than this (~25,000 partitions with 20-character names).
MAX_MULTI_REQUEST_FRAME = 1 << 20
MAX_TOPIC_BYTES = 249

_REQUEST_FIXED = struct.Struct(">hiiiiibi")  # version .. isolation_level, partition_count
_PARTITION_REQUEST = struct.Struct(">iiqii")  # partition .. partition_max_bytes (after the topic)
_KNOWN = struct.Struct(">qq")  # known_high_watermark, known_log_start_offset (version 3)
_SPARSE_PARTITION_REQUEST = struct.Struct(">iiqiiqq")  # a version-3 partition (after the topic)
_RESPONSE_FIXED = struct.Struct(">ih")  # correlation_id, error_code
_PARTITION_RESPONSE = struct.Struct(">ihqqqiqq")  # partition .. last_stable_offset
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_SHORT = struct.Struct(">h")
_new_tuple = tuple.__new__  # builds a PartitionFetch without NamedTuple's Python-level __new__
_INT = struct.Struct(">i")


class PartitionFetch(NamedTuple):
    """One partition of a multi-partition fetch (a tuple: a wide fetch builds hundreds)."""

    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = NO_EPOCH
    last_fetched_epoch: int = NO_EPOCH
    #: Version 3: what the fetcher knows of the partition; -1 = nothing (always answered).
    known_high_watermark: int = -1
    known_log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class MultiFetchRequest:
    correlation_id: int
    replica_id: int
    partitions: tuple[PartitionFetch, ...]
    max_bytes: int
    min_bytes: int = 1
    max_wait_ms: int = 0
    isolation_level: int = READ_UNCOMMITTED
    #: Version 3: the answer leaves out partitions with nothing new (see the module docstring).
    sparse: bool = False

    @property
    def from_follower(self) -> bool:
        return self.replica_id >= 0

    @property
    def version(self) -> int:
        return SPARSE_FETCH_VERSION if self.sparse else MULTI_FETCH_VERSION


class PartitionHeader(NamedTuple):
    """A partition's part of a response, before its ``records_length`` record bytes. (A tuple: a
    wide fetch makes one per partition read, and a frozen dataclass's construction cost more
    than the read.)"""

    topic: str
    partition: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    diverging_epoch: int = NO_EPOCH
    diverging_end_offset: int = -1
    message: str = ""
    records_length: int = 0
    last_stable_offset: int = -1
    #: ``(producer_id, first_offset)`` of aborted transactions overlapping the records.
    aborted: tuple[tuple[int, int], ...] = ()

    def error(self) -> errors.TributaryError | None:
        if self.error_code == 0:
            return None
        return errors.for_kafka_code(self.error_code)(self.message)


class PartitionData(NamedTuple):
    """A decoded partition of a response: its header and a view of its record bytes."""

    header: PartitionHeader
    records: memoryview


@dataclass(frozen=True, slots=True)
class MultiFetchResponse:
    correlation_id: int
    error_code: int
    message: str
    partitions: tuple[PartitionData, ...]

    def error(self) -> errors.TributaryError | None:
        if self.error_code == 0:
            return None
        return errors.for_kafka_code(self.error_code)(self.message)


def _string(text: str, limit: int) -> bytes:
    data = text.encode()
    if len(data) > limit:
        raise ValueError(f"string of {len(data)} bytes exceeds {limit}")
    return _SHORT.pack(len(data)) + data


def _message_bytes(message: str) -> bytes:
    """A length-prefixed message, cut to what an int16 length can say."""
    data = message.encode()[:32767]
    return _SHORT.pack(len(data)) + data


def _message(error: errors.TributaryError | None) -> bytes:
    return _message_bytes(error.message if error else "")


# ---- requests -----------------------------------------------------------------------------------


def encode_request(request: MultiFetchRequest) -> bytes:
    sparse = request.sparse
    topics: dict[str, bytes] = {}  # each topic's UTF-8 once (a wide fetch names few topics)
    parts = [
        _REQUEST_FIXED.pack(
            request.version,
            request.correlation_id,
            request.replica_id,
            request.max_wait_ms,
            request.min_bytes,
            request.max_bytes,
            request.isolation_level,
            len(request.partitions),
        )
    ]
    # Each entry is one pack of its topic's entry layout (see ``_entry_struct``): a wide fetch
    # names the same topic for many partitions in a row.
    last_topic: str | None = None
    raw, pack = b"", _entry_struct(0, sparse).pack
    append = parts.append
    # (the entries are unpacked as the tuples they are: faster than their named fields)
    for (
        topic,
        partition,
        offset,
        partition_max,
        leader_epoch,
        last_epoch,
        known_hw,
        known_start,
    ) in request.partitions:
        if topic != last_topic:
            last_topic = topic
            known = topics.get(topic)
            if known is None:
                known = topics[topic] = _string(topic, MAX_TOPIC_BYTES)[_SHORT.size :]
            raw, pack = known, _entry_struct(len(known), sparse).pack
        if sparse:
            append(
                pack(
                    len(raw),
                    raw,
                    partition,
                    leader_epoch,
                    offset,
                    last_epoch,
                    partition_max,
                    known_hw,
                    known_start,
                )
            )
        else:
            append(pack(len(raw), raw, partition, leader_epoch, offset, last_epoch, partition_max))
    body = b"".join(parts)
    return SIZE.pack(len(body)) + body


def decode_request_body(body: bytes | memoryview) -> MultiFetchRequest:
    """Parse a version-1 or -3 request body (after the size). InvalidRequestError on bad input."""
    view = memoryview(body)
    if len(view) < _REQUEST_FIXED.size:
        raise errors.InvalidRequestError(f"fetch request of {len(view)} bytes is shorter than its header")
    version, correlation_id, replica_id, max_wait_ms, min_bytes, max_bytes, isolation, count = (
        _REQUEST_FIXED.unpack_from(view)
    )
    sparse = _check_fixed(version, replica_id, isolation, (max_wait_ms, min_bytes, max_bytes))
    entry = _PARTITION_REQUEST.size + (_KNOWN.size if sparse else 0)
    if count < 0 or count * (_SHORT.size + entry) > len(view) - _REQUEST_FIXED.size:
        raise errors.InvalidRequestError(f"fetch request announces {count} partitions its frame cannot hold")
    position = _REQUEST_FIXED.size
    end = len(view)
    partitions: list[PartitionFetch] = []
    append = partitions.append
    seen: dict[str, set[int]] = {}  # partition numbers by topic
    topics: dict[bytes, str] = {}  # a wide fetch names few topics: each decoded once
    # A wide fetch names the same topic for many partitions in a row: while it does, each entry
    # is one fixed-size struct (topic length, topic bytes, fields). A run is read with one
    # iter_unpack over as many entries as the frame could hold, each checked against the topic's
    # bytes; the first entry naming another topic ends the run -- the per-partition cost of a
    # wide fetch session.
    while len(partitions) < count:
        topic, after = _read_topic(view, position, topics)
        if after + entry > end:
            raise errors.InvalidRequestError("fetch request is truncated inside a partition")
        run_length = after - position - _SHORT.size
        run_raw = view[position + _SHORT.size : after].tobytes()
        run = _entry_struct(run_length, sparse)
        size = run.size
        numbers = seen.setdefault(topic, set())
        room = min(count - len(partitions), (end - position) // size)
        for fields in run.iter_unpack(view[position : position + room * size]):
            if sparse:
                (
                    length,
                    raw,
                    partition,
                    leader_epoch,
                    offset,
                    last_epoch,
                    partition_max,
                    known_hw,
                    known_start,
                ) = fields
            else:
                length, raw, partition, leader_epoch, offset, last_epoch, partition_max = fields
                known_hw = known_start = -1
            if length != run_length or raw != run_raw:
                break  # another topic: the next run
            if partition < 0 or partition_max < 0 or leader_epoch < NO_EPOCH or last_epoch < NO_EPOCH:
                raise errors.InvalidRequestError(f"fetch of {topic}-{partition} has a negative field")
            if partition in numbers:
                raise errors.InvalidRequestError(f"fetch request names {topic}-{partition} twice")
            numbers.add(partition)
            append(
                _new_tuple(
                    PartitionFetch,
                    (
                        topic,
                        partition,
                        offset,
                        partition_max,
                        leader_epoch,
                        last_epoch,
                        known_hw,
                        known_start,
                    ),
                )
            )
            position += size
    if position != len(view):
        raise errors.InvalidRequestError(f"fetch request has {len(view) - position} trailing bytes")
    return MultiFetchRequest(
        correlation_id, replica_id, tuple(partitions), max_bytes, min_bytes, max_wait_ms, isolation, sparse
    )


@functools.lru_cache(maxsize=256)
def _entry_struct(topic_length: int, sparse: bool) -> struct.Struct:
    """One request entry with a topic of ``topic_length`` bytes: its length, its bytes, then the
    partition's fields (version 3: with the known offsets)."""
    fields = _SPARSE_PARTITION_REQUEST.format if sparse else _PARTITION_REQUEST.format
    return struct.Struct(f">h{topic_length}s{fields[1:]}")


def _check_fixed(version: int, replica_id: int, isolation: int, bounds: tuple[int, int, int]) -> bool:
    """Check a request's fixed fields; whether it is sparse (version 3)."""
    if version not in (MULTI_FETCH_VERSION, SPARSE_FETCH_VERSION):
        raise errors.UnsupportedVersionError(f"multi-partition fetch version {version}")
    sparse = version == SPARSE_FETCH_VERSION
    if min(bounds) < 0 or replica_id < CONSUMER_REPLICA_ID:
        raise errors.InvalidRequestError("fetch request has a negative size, wait or replica id")
    if sparse and replica_id != CONSUMER_REPLICA_ID:
        raise errors.InvalidRequestError("sparse (version 3) fetches are for consumers only")
    if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise errors.InvalidRequestError(f"fetch request isolation level {isolation} is not 0 or 1")
    return sparse


def is_quiet(fetch: PartitionFetch, header: PartitionHeader, records_length: int, committed: bool) -> bool:
    """Whether a version-3 answer leaves ``fetch`` out: nothing to read, no error, and the
    offsets its fetcher knows (read_committed: the last stable offset stands for the high
    watermark)."""
    return (
        records_length == 0
        and header.error_code == 0
        and header.diverging_epoch < 0
        and fetch.known_high_watermark == (header.last_stable_offset if committed else header.high_watermark)
        and fetch.known_log_start_offset == header.log_start_offset
    )


def _read_topic(view: memoryview, position: int, topics: dict[bytes, str]) -> tuple[str, int]:
    """A request's topic (int16 length, UTF-8), through ``topics`` (the names decoded so far)."""
    if position + _SHORT.size > len(view):
        raise errors.InvalidRequestError("fetch frame is truncated before a topic")
    (length,) = _SHORT.unpack_from(view, position)
    end = position + _SHORT.size + length
    if length < 0 or end > len(view):
        raise errors.InvalidRequestError(f"fetch frame topic length {length} runs past the frame")
    raw = view[position + _SHORT.size : end].tobytes()
    topic = topics.get(raw)
    if topic is None:
        try:
            topic = topics[raw] = raw.decode()
        except UnicodeDecodeError as exc:
            raise errors.InvalidRequestError("fetch frame topic is not UTF-8") from exc
    return topic, end


# ---- responses ----------------------------------------------------------------------------------


def encode_partition_header(
    header: PartitionHeader, error: errors.TributaryError | None = None, *, records_length: int | None = None
) -> bytes:
    """A partition's header bytes; ``records_length`` (default ``header.records_length``) record
    bytes must follow. (The server passes the length it will send rather than copying the
    header with it: a wide fetch encodes hundreds of headers, and the copy cost more than the
    encoding.)"""
    if records_length is None:
        records_length = header.records_length
    return (
        _string(header.topic, MAX_TOPIC_BYTES)
        + _PARTITION_RESPONSE.pack(
            header.partition,
            error.kafka_code if error else header.error_code,
            header.high_watermark,
            header.log_start_offset,
            header.log_end_offset,
            header.diverging_epoch,
            header.diverging_end_offset,
            header.last_stable_offset,
        )
        + _INT.pack(len(header.aborted))
        + b"".join(_ABORTED.pack(pid, first) for pid, first in header.aborted)
        + (_message(error) if error else _message_bytes(header.message))
        + _INT.pack(records_length)
    )


def encode_response_prefix(
    correlation_id: int, partition_count: int, body_length: int, error: errors.TributaryError | None = None
) -> bytes:
    """The size, fixed part and partition count of a response whose partition headers and
    records together take ``body_length`` bytes."""
    fixed = _RESPONSE_FIXED.pack(correlation_id, error.kafka_code if error else 0) + _message(error)
    fixed += _INT.pack(partition_count)
    return SIZE.pack(len(fixed) + body_length) + fixed


def encode_error_response(correlation_id: int, error: errors.TributaryError) -> bytes:
    return encode_response_prefix(correlation_id, 0, 0, error)


def decode_response_body(body: bytes | bytearray | memoryview) -> MultiFetchResponse:
    """Parse a whole response body (after the size); record bytes are views into ``body``.
    CorruptRecordError when the frame is inconsistent."""
    view = memoryview(body)
    try:
        correlation_id, error_code = _RESPONSE_FIXED.unpack_from(view)
        position = _RESPONSE_FIXED.size
        message, position = _read_response_string(view, position)
        (count,) = _INT.unpack_from(view, position)
        position += _INT.size
        partitions = []
        for _ in range(count):
            topic, position = _read_response_string(view, position)
            partition, code, high_watermark, log_start, log_end, diverging_epoch, diverging_end, lso = (
                _PARTITION_RESPONSE.unpack_from(view, position)
            )
            position += _PARTITION_RESPONSE.size
            (aborted_count,) = _INT.unpack_from(view, position)
            position += _INT.size
            if aborted_count < 0 or position + aborted_count * _ABORTED.size > len(view):
                raise errors.CorruptRecordError(
                    f"aborted transactions of {topic}-{partition} run past the frame"
                )
            aborted = tuple(
                _ABORTED.unpack_from(view, position + i * _ABORTED.size) for i in range(aborted_count)
            )
            position += aborted_count * _ABORTED.size
            partition_message, position = _read_response_string(view, position)
            (records_length,) = _INT.unpack_from(view, position)
            position += _INT.size
            if records_length < 0 or position + records_length > len(view):
                raise errors.CorruptRecordError(f"records of {topic}-{partition} run past the frame")
            header = _new_tuple(
                PartitionHeader,
                (
                    topic,
                    partition,
                    code,
                    high_watermark,
                    log_start,
                    log_end,
                    diverging_epoch,
                    diverging_end,
                    partition_message,
                    records_length,
                    lso,
                    aborted,
                ),
            )
            partitions.append(_new_tuple(PartitionData, (header, view[position : position + records_length])))
            position += records_length
    except struct.error as exc:
        raise errors.CorruptRecordError(f"fetch response is truncated: {exc}") from exc
    if position != len(view):
        raise errors.CorruptRecordError(f"fetch response has {len(view) - position} trailing bytes")
    return MultiFetchResponse(correlation_id, error_code, message, tuple(partitions))


def _read_response_string(view: memoryview, position: int) -> tuple[str, int]:
    (length,) = _SHORT.unpack_from(view, position)
    position += _SHORT.size
    if length < 0 or position + length > len(view):
        raise errors.CorruptRecordError("fetch response string runs past the frame")
    return bytes(view[position : position + length]).decode(errors="replace"), position + length
