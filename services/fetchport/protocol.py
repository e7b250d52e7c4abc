"""The fetch port's wire format: pure encoding and decoding, no sockets (documented here in full).

Every integer is big-endian, as in Kafka's protocol. Each frame starts with an int32 size that
counts the bytes after it.

Request (client -> node)::

    size            int32   bytes after this field
    version         int16   FETCH_VERSION (0)
    correlation_id  int32   echoed in the response
    max_wait_ms     int32   long-poll bound; 0 answers at once
    min_bytes       int32   answer early once this many bytes are available
    max_bytes       int32   upper bound on record bytes (the first batch is sent whole anyway)
    offset          int64   first offset wanted
    partition       int32
    topic_length    int16   then topic_length bytes of UTF-8

Response (node -> client)::

    size            int32   bytes after this field (header and records)
    correlation_id  int32
    error_code      int16   Kafka's numeric error code, 0 = none
    high_watermark  int64
    log_start_offset int64
    log_end_offset  int64
    message_length  int16   then message_length bytes of UTF-8 (the error's explanation)
    records_length  int32   then records_length bytes of whole RecordBatch v2 batches

The records are written straight from the segment file with ``os.sendfile``; this module only
builds and parses the fixed parts around them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from services import errors

FETCH_VERSION = 0
#: Refuse request frames larger than this: a request is ~30 bytes plus a topic name (<= 249).
MAX_REQUEST_FRAME = 4096
#: Refuse response frames larger than this on the client side (a misbehaving or foreign peer).
MAX_RESPONSE_FRAME = 1 << 30

SIZE = struct.Struct(">i")
_REQUEST_FIXED = struct.Struct(">hiiiiqih")  # version .. topic_length
_RESPONSE_FIXED = struct.Struct(">ihqqqh")  # correlation_id .. message_length
_RECORDS_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class FetchRequest:
    correlation_id: int
    topic: str
    partition: int
    offset: int
    max_bytes: int
    min_bytes: int = 1
    max_wait_ms: int = 0


class FetchResponseHeader(NamedTuple):
    """Everything in a response before the record bytes; ``records_length`` of them follow. (A
    tuple: the gateway makes one per partition of a wide fetch's answer.)"""

    correlation_id: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    message: str
    records_length: int

    def error(self) -> errors.TributaryError | None:
        """The typed error this response carries, or None."""
        if self.error_code == 0:
            return None
        return errors.for_kafka_code(self.error_code)(self.message)


def encode_request(request: FetchRequest) -> bytes:
    topic = request.topic.encode()
    body = (
        _REQUEST_FIXED.pack(
            FETCH_VERSION,
            request.correlation_id,
            request.max_wait_ms,
            request.min_bytes,
            request.max_bytes,
            request.offset,
            request.partition,
            len(topic),
        )
        + topic
    )
    return SIZE.pack(len(body)) + body


def decode_request_body(body: bytes | memoryview) -> FetchRequest:
    """Parse a request frame's body (after the size). Raises InvalidRequestError on bad input."""
    if len(body) < _REQUEST_FIXED.size:
        raise errors.InvalidRequestError(f"fetch request of {len(body)} bytes is shorter than its header")
    version, correlation_id, max_wait_ms, min_bytes, max_bytes, offset, partition, topic_len = (
        _REQUEST_FIXED.unpack_from(body)
    )
    if version != FETCH_VERSION:
        raise errors.UnsupportedVersionError(
            f"fetch request version {version} (this node speaks {FETCH_VERSION})"
        )
    if topic_len < 0 or _REQUEST_FIXED.size + topic_len != len(body):
        raise errors.InvalidRequestError(
            f"fetch request topic length {topic_len} does not match the frame ({len(body)} bytes)"
        )
    try:
        topic = bytes(body[_REQUEST_FIXED.size :]).decode()
    except UnicodeDecodeError as exc:
        raise errors.InvalidRequestError("fetch request topic is not UTF-8") from exc
    if max_bytes < 0 or min_bytes < 0 or max_wait_ms < 0 or partition < 0:
        raise errors.InvalidRequestError("fetch request has a negative size, wait or partition")
    return FetchRequest(correlation_id, topic, partition, offset, max_bytes, min_bytes, max_wait_ms)


def check_request_size(size: int) -> None:
    if size <= 0 or size > MAX_REQUEST_FRAME:
        raise errors.InvalidRequestError(f"fetch request frame size {size} outside 1..{MAX_REQUEST_FRAME}")


def encode_response_header(
    correlation_id: int,
    *,
    high_watermark: int = -1,
    log_start_offset: int = -1,
    log_end_offset: int = -1,
    records_length: int = 0,
    error: errors.TributaryError | None = None,
) -> bytes:
    """The size prefix and header of a response; ``records_length`` record bytes must follow."""
    message = (error.message if error else "").encode()[:32767]
    fixed = _RESPONSE_FIXED.pack(
        correlation_id,
        error.kafka_code if error else 0,
        high_watermark,
        log_start_offset,
        log_end_offset,
        len(message),
    )
    size = len(fixed) + len(message) + _RECORDS_LENGTH.size + records_length
    return SIZE.pack(size) + fixed + message + _RECORDS_LENGTH.pack(records_length)


def response_prefix_length(first_bytes: bytes | memoryview) -> int:
    """How many bytes of header follow the size field, given at least the fixed part."""
    (message_length,) = struct.unpack_from(">h", first_bytes, _RESPONSE_FIXED.size - 2)
    return _RESPONSE_FIXED.size + message_length + _RECORDS_LENGTH.size


RESPONSE_FIXED_SIZE = _RESPONSE_FIXED.size


def decode_response_header(header: bytes | memoryview, frame_size: int) -> FetchResponseHeader:
    """Parse the header part (after the size field). Raises CorruptRecordError on inconsistency."""
    if len(header) < _RESPONSE_FIXED.size + _RECORDS_LENGTH.size:
        raise errors.CorruptRecordError("fetch response header truncated")
    correlation_id, error_code, hw, start, end, message_length = _RESPONSE_FIXED.unpack_from(header)
    if message_length < 0 or len(header) != _RESPONSE_FIXED.size + message_length + _RECORDS_LENGTH.size:
        raise errors.CorruptRecordError("fetch response message length is inconsistent")
    message = bytes(header[_RESPONSE_FIXED.size : _RESPONSE_FIXED.size + message_length]).decode(
        errors="replace"
    )
    (records_length,) = _RECORDS_LENGTH.unpack_from(header, _RESPONSE_FIXED.size + message_length)
    if records_length < 0 or len(header) + records_length != frame_size:
        raise errors.CorruptRecordError(
            f"fetch response records length {records_length} does not match frame size {frame_size}"
        )
    return FetchResponseHeader(correlation_id, error_code, hw, start, end, message, records_length)
