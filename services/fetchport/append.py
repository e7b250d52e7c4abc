"""The data port's append frames (version 2): pure encoding and decoding, no sockets.

The storage node's raw TCP port (the fetch port, :mod:`services.fetchport.protocol` and
:mod:`~services.fetchport.multi`) also takes appends, so the gateway writes to a node the way it
reads from it: one long-lived connection per node, many requests in flight on it (pipelined), each
answered with its correlation id when done -- in completion order, not request order. Appends of
one partition on one connection are applied in the order they were received.

Why not gRPC: a unary ``StorageNode.Append`` costs a gRPC message in Python on both sides (HTTP/2
framing, protobuf copies of the record bytes, a call object), ~100 us per call on this machine;
this frame is a fixed header around the record bytes, read straight into one buffer whose slices
go to the log.

A connection is told apart by its first frame's version: a connection whose first frame is an
append (version 2) carries appends only, for its whole life; fetches (versions 0 and 1) go on
other connections. Every integer is big-endian, as in Kafka.

Request (client -> node)::

    size                 int32   bytes after this field
    version              int16   2 (APPEND_VERSION)
    correlation_id       int32   echoed in the response; >= 0 (-1 is the node's, see below)
    acks                 int8    0 none, 1 leader, -1 all (the in-sync replicas)
    timeout_ms           int32   how long acks=all waits for the in-sync replicas; 0 = the node's
                                 default (30 s)
    trace_length         int16   then trace_length bytes of UTF-8: the sender's W3C trace context
                                 headers (``traceparent``, ``tracestate``) as ``name:value``
                                 lines joined by "\n", so the node's spans join the trace;
                                 0 = none
    partition_count      int32   then, per partition:
      topic_length       int16   then topic_length bytes of UTF-8 (1..249)
      partition          int32   >= 0
      leader_epoch       int32   the leader epoch the client routed by; -1 = do not check (else a
                                 node whose epoch differs answers FENCED_LEADER_EPOCH or
                                 UNKNOWN_LEADER_EPOCH and writes nothing)
      records_length     int32   then records_length bytes of whole RecordBatch v2 batches

Response (node -> client)::

    size                 int32   bytes after this field
    correlation_id       int32   the request's; -1 for a connection-level error (then the node
                                 closes the connection)
    error_code           int16   a request-level error (then partition_count is 0)
    message_length       int16   then message_length bytes of UTF-8
    partition_count      int32   then, per partition, in request order:
      topic_length       int16   then topic bytes
      partition          int32
      error_code         int16   Kafka's numeric code, 0 = none (nothing of the partition written)
      base_offset        int64   offset of the first record written; -1 on error
      last_offset        int64   offset of the last record written; -1 on error
      log_append_time    int64   the broker's append time (ms) on LogAppendTime topics, else -1
      log_start_offset   int64   the partition's log start offset after the append, or -1
      record_count       int32   records written
      message_length     int16   then message_length bytes of UTF-8 (the error's explanation)

Every request is answered, acks=0 included: ``acks`` decides what the answer waits for (nothing,
the leader's write, the in-sync replicas), and the gateway that sends it retries failed appends
in the background even when its own client asked for no answer.

Handshake: a client opens a connection with an append of no partitions (a probe). A node that
speaks version 2 answers it with an empty response carrying the probe's correlation id. A node
that does not answers a version-0 error frame (``protocol.encode_response_header``: correlation id
-1, then error_code UNSUPPORTED_VERSION) and closes -- both layouts start with the correlation id
and the error code, which is all :func:`connection_error` reads. The client then uses gRPC.

Bad input: a frame whose size is outside ``1..max_frame`` (the node's bound on an append, as its
gRPC message bound), whose version is unknown, or that does not parse ends the connection: the
node reads no further, answers the requests before it, then a connection-level error
(correlation id -1, INVALID_REQUEST or UNSUPPORTED_VERSION), and closes; nothing of the bad frame
is written. A record batch that parses as a frame but not as
batches is a per-partition error (CORRUPT_MESSAGE), as over gRPC.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport.protocol import SIZE

APPEND_VERSION = 2
#: The correlation id of a connection-level error answer.
CONNECTION_ERROR_ID = -1
NO_EPOCH = -1
MAX_TOPIC_BYTES = 249

_VERSION = struct.Struct(">h")
_REQUEST_FIXED = struct.Struct(">hibih")  # version, correlation_id, acks, timeout_ms, trace_length
_PARTITION_REQUEST = struct.Struct(">iii")  # partition, leader_epoch, records_length (after the topic)
_RESPONSE_FIXED = struct.Struct(">ih")  # correlation_id, error_code
_PARTITION_RESPONSE = struct.Struct(">ihqqqqi")  # partition .. record_count (after the topic)
_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")
_ACKS = {int(a): a for a in Acks}

#: The least a request takes (after the size), and the least a partition takes.
REQUEST_FIXED_SIZE = _REQUEST_FIXED.size + _INT.size
_PARTITION_MIN = _SHORT.size + 1 + _PARTITION_REQUEST.size


@dataclass(frozen=True, slots=True)
class PartitionAppend:
    """One partition's batches in an append request; ``records`` is a view into the frame."""

    topic: str
    partition: int
    records: bytes | memoryview
    leader_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class AppendRequest:
    correlation_id: int
    acks: Acks
    timeout_ms: int
    partitions: tuple[PartitionAppend, ...]
    #: Trace context headers, ``(name, value)`` pairs (W3C ``traceparent``, ``tracestate``).
    trace_context: tuple[tuple[str, str], ...] = ()


def _trace_bytes(pairs: tuple[tuple[str, str], ...]) -> bytes:
    data = "\n".join(f"{name}:{value}" for name, value in pairs).encode()
    if len(data) > 32767:
        raise ValueError(f"trace context of {len(data)} bytes is too long")
    return data


def _trace_pairs(data: bytes | memoryview) -> tuple[tuple[str, str], ...]:
    try:
        text = bytes(data).decode()
    except UnicodeDecodeError as exc:
        raise errors.InvalidRequestError("append request trace context is not UTF-8") from exc
    pairs = []
    for line in text.split("\n") if text else ():
        name, colon, value = line.partition(":")
        if not colon or not name:
            raise errors.InvalidRequestError(f"append request trace context line {line!r} is not name:value")
        pairs.append((name, value))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class AppendResponse:
    correlation_id: int
    #: A request-level error (then ``results`` is empty), or None.
    error: errors.TributaryError | None
    results: tuple[AppendResult, ...]


def _topic_bytes(topic: str) -> bytes:
    data = topic.encode()
    if not 0 < len(data) <= MAX_TOPIC_BYTES:
        raise ValueError(f"topic of {len(data)} bytes is outside 1..{MAX_TOPIC_BYTES}")
    return data


def _message_bytes(error: errors.TributaryError | None) -> bytes:
    data = (error.message if error else "").encode()[:32767]
    return _SHORT.pack(len(data)) + data


#: ``_message_bytes(None)``: the empty message of a partition without an error.
_NO_MESSAGE = _SHORT.pack(0)


def _error_from(code: int, message: str) -> errors.TributaryError:
    return errors.for_kafka_code(code)(message)


# ---- requests -----------------------------------------------------------------------------------


def encode_request_parts(request: AppendRequest) -> list[bytes | memoryview]:
    """The request frame as a list of pieces (the record bytes are not copied), for a
    ``writelines``/``sendmsg``; ``b"".join`` of it is the frame."""
    if request.correlation_id < 0:
        raise ValueError(f"correlation id {request.correlation_id} is negative")
    trace = _trace_bytes(request.trace_context)
    parts: list[bytes | memoryview] = [b""]
    size = _REQUEST_FIXED.size + len(trace) + _INT.size
    # A request's partitions are mostly one topic's: its length-prefixed name is encoded once.
    topic_heads: dict[str, bytes] = {}
    for p in request.partitions:
        topic_head = topic_heads.get(p.topic)
        if topic_head is None:
            topic = _topic_bytes(p.topic)
            topic_head = topic_heads[p.topic] = _SHORT.pack(len(topic)) + topic
        head = topic_head + _PARTITION_REQUEST.pack(p.partition, p.leader_epoch, len(p.records))
        parts.append(head)
        parts.append(p.records)
        size += len(head) + len(p.records)
    parts[0] = (
        SIZE.pack(size)
        + _REQUEST_FIXED.pack(
            APPEND_VERSION, request.correlation_id, int(request.acks), request.timeout_ms, len(trace)
        )
        + trace
        + _INT.pack(len(request.partitions))
    )
    return parts


def encode_request(request: AppendRequest) -> bytes:
    return b"".join(encode_request_parts(request))


def probe(correlation_id: int) -> bytes:
    """The handshake: an append of no partitions (see the module docstring)."""
    return encode_request(AppendRequest(correlation_id, Acks.LEADER, 0, ()))


def request_version(first_bytes: bytes | bytearray | memoryview) -> int:
    """The version of a frame, from the first two bytes of its body."""
    return _VERSION.unpack_from(first_bytes)[0]


def decode_request_body(body: bytes | bytearray | memoryview) -> AppendRequest:
    """Parse a request body (after the size field). Record bytes are views into ``body``, not
    copies. Raises InvalidRequestError (or UnsupportedVersionError) on bad input."""
    view = memoryview(body)
    if len(view) < REQUEST_FIXED_SIZE:
        raise errors.InvalidRequestError(f"append request of {len(view)} bytes is shorter than its header")
    version, correlation_id, acks_value, timeout_ms, trace_length = _REQUEST_FIXED.unpack_from(view)
    if version != APPEND_VERSION:
        raise errors.UnsupportedVersionError(f"append request version {version} (this node speaks 2)")
    if correlation_id < 0:
        raise errors.InvalidRequestError(f"append request correlation id {correlation_id} is negative")
    acks = _ACKS.get(acks_value)
    if acks is None:
        raise errors.InvalidRequestError(f"append request acks {acks_value} is not 0, 1 or -1")
    if timeout_ms < 0:
        raise errors.InvalidRequestError(f"append request timeout_ms {timeout_ms} is negative")
    position = _REQUEST_FIXED.size + trace_length
    if trace_length < 0 or position + _INT.size > len(view):
        raise errors.InvalidRequestError(
            f"append request trace context length {trace_length} is out of bounds"
        )
    trace_context = _trace_pairs(view[_REQUEST_FIXED.size : position])
    (count,) = _INT.unpack_from(view, position)
    position += _INT.size
    if count < 0 or count * _PARTITION_MIN > len(view) - position:
        raise errors.InvalidRequestError(f"append request announces {count} partitions its frame cannot hold")
    partitions = []
    seen: set[tuple[str, int]] = set()
    end = len(view)
    names: dict[bytes, str] = {}
    for _ in range(count):
        partition_append, position = _decode_partition(view, position, names)
        key = (partition_append.topic, partition_append.partition)
        if key in seen:
            raise errors.InvalidRequestError(f"append request names {key[0]}-{key[1]} twice")
        seen.add(key)
        partitions.append(partition_append)
    if position != end:
        raise errors.InvalidRequestError(f"append request has {end - position} trailing bytes")
    return AppendRequest(correlation_id, acks, timeout_ms, tuple(partitions), trace_context)


def _decode_partition(
    view: memoryview, position: int, names: dict[bytes, str]
) -> tuple[PartitionAppend, int]:
    """One partition's append at ``position``; ``names``: the topic names decoded so far in
    this request (raw bytes -> str), so a name repeated per partition is decoded once."""
    end = len(view)
    if position + _SHORT.size > end:
        raise errors.InvalidRequestError("append request is truncated before a topic")
    (topic_length,) = _SHORT.unpack_from(view, position)
    position += _SHORT.size
    if not 0 < topic_length <= MAX_TOPIC_BYTES or position + topic_length > end:
        raise errors.InvalidRequestError(f"append request topic length {topic_length} is out of bounds")
    raw = bytes(view[position : position + topic_length])
    topic = names.get(raw)
    if topic is None:
        try:
            topic = names[raw] = raw.decode()
        except UnicodeDecodeError as exc:
            raise errors.InvalidRequestError("append request topic is not UTF-8") from exc
    position += topic_length
    if position + _PARTITION_REQUEST.size > end:
        raise errors.InvalidRequestError("append request is truncated inside a partition")
    partition, leader_epoch, records_length = _PARTITION_REQUEST.unpack_from(view, position)
    position += _PARTITION_REQUEST.size
    if partition < 0 or leader_epoch < NO_EPOCH:
        raise errors.InvalidRequestError(f"append of {topic}-{partition} has a negative field")
    if records_length < 0 or position + records_length > end:
        raise errors.InvalidRequestError(
            f"append of {topic}-{partition}: {records_length} record bytes run past the frame"
        )
    records = view[position : position + records_length]
    return PartitionAppend(topic, partition, records, leader_epoch), position + records_length


# ---- responses ----------------------------------------------------------------------------------


def encode_response(correlation_id: int, results: Sequence[AppendResult]) -> bytes:
    """A whole response frame: one result per partition, in request order."""
    parts = [
        b"",
        _RESPONSE_FIXED.pack(correlation_id, 0),
        _SHORT.pack(0),
        _INT.pack(len(results)),
    ]
    topic_heads: dict[str, bytes] = {}  # each topic's length-prefixed name, encoded once
    for r in results:
        topic_head = topic_heads.get(r.topic)
        if topic_head is None:
            topic = r.topic.encode()
            topic_head = topic_heads[r.topic] = _SHORT.pack(len(topic)) + topic
        error = r.error
        parts.append(topic_head)
        parts.append(
            _PARTITION_RESPONSE.pack(
                r.partition,
                error.kafka_code if error else 0,
                r.base_offset,
                r.last_offset,
                r.log_append_time,
                r.log_start_offset,
                r.record_count,
            )
        )
        parts.append(_message_bytes(error) if error is not None else _NO_MESSAGE)
    body = b"".join(parts)
    return SIZE.pack(len(body)) + body


def encode_error_response(correlation_id: int, error: errors.TributaryError) -> bytes:
    """A request-level (or, with correlation id -1, connection-level) error answer."""
    body = _RESPONSE_FIXED.pack(correlation_id, error.kafka_code) + _message_bytes(error) + _INT.pack(0)
    return SIZE.pack(len(body)) + body


def response_correlation_id(body: bytes | bytearray | memoryview) -> int:
    """The correlation id of a response body (after the size field)."""
    if len(body) < _INT.size:
        raise errors.CorruptRecordError("append response is shorter than its correlation id")
    return _INT.unpack_from(body)[0]


def connection_error(body: bytes | bytearray | memoryview) -> errors.TributaryError:
    """The error of a connection-level answer (correlation id -1) in this layout or in the
    fetch port's version 0 (an older node refusing version 2): both start with the correlation
    id and the error code; the message is read when this layout's is well formed."""
    if len(body) < _RESPONSE_FIXED.size:
        return errors.CorruptRecordError("connection-level error answer is truncated")
    _, code = _RESPONSE_FIXED.unpack_from(body)
    message = "the node closed the connection"
    try:
        decoded = decode_response_body(body)
    except errors.TributaryError:
        pass
    else:
        if decoded.error is not None and decoded.error.message:
            message = decoded.error.message
    return _error_from(code, message)


def decode_response_body(body: bytes | bytearray | memoryview) -> AppendResponse:
    """Parse a response body (after the size). CorruptRecordError when it is inconsistent."""
    view = memoryview(body)
    try:
        correlation_id, error_code = _RESPONSE_FIXED.unpack_from(view)
        position = _RESPONSE_FIXED.size
        message, position = _read_string(view, position)
        (count,) = _INT.unpack_from(view, position)
        position += _INT.size
        if count < 0 or count * (_SHORT.size + _PARTITION_RESPONSE.size + _SHORT.size) > len(view) - position:
            raise errors.CorruptRecordError(f"append response announces {count} partitions")
        results = []
        names: dict[bytes, str] = {}
        for _ in range(count):
            topic, position = _read_string(view, position, names)
            partition, code, base, last, append_time, log_start, record_count = (
                _PARTITION_RESPONSE.unpack_from(view, position)
            )
            position += _PARTITION_RESPONSE.size
            partition_message, position = _read_string(view, position)
            results.append(
                AppendResult(
                    topic,
                    partition,
                    base_offset=base,
                    last_offset=last,
                    log_append_time=append_time,
                    log_start_offset=log_start,
                    record_count=record_count,
                    error=_error_from(code, partition_message) if code else None,
                )
            )
    except struct.error as exc:
        raise errors.CorruptRecordError(f"append response is truncated: {exc}") from exc
    if position != len(view):
        raise errors.CorruptRecordError(f"append response has {len(view) - position} trailing bytes")
    error = _error_from(error_code, message) if error_code else None
    return AppendResponse(correlation_id, error, tuple(results))


def _read_string(view: memoryview, position: int, names: dict[bytes, str] | None = None) -> tuple[str, int]:
    """The string at ``position`` and the position after it; ``names`` (raw bytes -> str)
    remembers the strings decoded so far, for one repeated per partition (the topic)."""
    (length,) = _SHORT.unpack_from(view, position)
    position += _SHORT.size
    if length < 0 or position + length > len(view):
        raise errors.CorruptRecordError("append response string runs past the frame")
    if not length:
        return "", position
    raw = bytes(view[position : position + length])
    if names is None:
        return raw.decode(errors="replace"), position + length
    text = names.get(raw)
    if text is None:
        text = names[raw] = raw.decode(errors="replace")
    return text, position + length
