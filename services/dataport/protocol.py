"""The gateway's raw data protocol: pure encoding and decoding, no sockets (documented here in full).

The Gateway's gRPC API is the typed API for every language. Beside it a gateway may offer a *raw
data listener* (its address is ``GetMetadataResponse.data_address``) that carries produce and
fetch requests as length-prefixed binary frames on one TCP connection, pipelined, in the style
of the storage node's fetch port (``services/fetchport``). It exists for speed: a gRPC message
costs Python ~0.13 ms on each side (~7,900 messages/s, ``bench/grpc_ceiling.py``), a frame here a
few microseconds, and fetched record batches travel from the storage node to the client without
being decoded or re-encoded by the gateway.

Conventions
-----------
Every integer is big-endian and signed (as in Kafka's protocol). A *string* is an int16 length
then that many bytes of UTF-8. *bytes* are an int32 length then that many bytes. Every frame, in
both directions, starts with an int32 ``size`` counting the bytes after it; a receiver refuses a
``size`` below the smallest frame or above its limit (``MAX_REQUEST_FRAME`` for the gateway,
``MAX_RESPONSE_FRAME`` for clients) and closes the connection.

Handshake
---------
The client's first frame::

    size            int32
    magic           int32   0x54524457 ("TRDW")
    min_version     int16   the oldest protocol version the client speaks
    max_version     int16   the newest
    client_id       string  Kafka's client.id (may be empty)
    auth_token      string  optional: a bearer token (``services/tokens.py``), sent by clients
                            configured with SASL_SSL / OAUTHBEARER; a frame that ends after
                            client_id carries none

The gateway answers::

    size            int32
    magic           int32   0x54524457
    error_code      int16   0, or 35 UNSUPPORTED_VERSION when no version fits (then it closes)
    version         int16   the version chosen (the highest both speak), -1 when refused
    min_version     int16   the range the gateway speaks, so a refused client can say why
    max_version     int16
    max_frame       int32   the largest request frame the gateway accepts
    message         string  the refusal's explanation, else empty

A gateway that authenticates clients by token answers a handshake without a valid
``auth_token`` with error_code 58 SASL_AUTHENTICATION_FAILED (version -1) and closes; it closes
a connection whose token has expired with an error frame of that code (the client reconnects
with a fresh token, as Kafka's KIP-368 re-authentication has it).

A client that does not like the chosen version closes the connection. A gateway that cannot take
the connection at all (too many open) sends an error frame (below) instead of the answer and
closes; the first byte after the size tells the two apart (127 for an error frame, 0x54 for the
magic number).

Versions: 1; 2, which adds ``throttle_time_ms`` to the produce and fetch responses (client
quotas, below); and 3, which adds incremental fetch sessions to the fetch request and response
("Fetch sessions", below). Produce frames are the same in 2 and 3. A gateway speaking 3 answers
a client that offers only 1 or 2 in that version.

Requests and responses
----------------------
After the handshake every frame is::

    size            int32
    kind            int8    see below
    correlation_id  int32   chosen by the client; echoed in the response

Requests may be pipelined: the client sends as many as it likes without waiting; the gateway
serves them concurrently and answers each, with its ``correlation_id``, in any order. Produce
requests are appended to each partition in the order they arrived on the connection (as a
Kafka broker does for one connection). A produce request with ``acks`` 0 gets no answer at all,
as in Kafka: the client counts it sent once written.

Kind 1, produce request::

    acks            int8    0 none, 1 leader, -1 all in-sync replicas
    timeout_ms      int32   0 = the gateway's default
    topic           string
    partition_count int32   then per partition (each at most once):
      partition     int32
      records       bytes   one or more whole RecordBatch v2 batches (magic 2), as the
                            client's producer built them (idempotent and transactional producers
                            carry producer id, epoch, sequence and the transactional flag in the
                            batch headers, exactly as over gRPC)
    trace_context   string  the W3C ``traceparent`` of the trace the request belongs to, empty
                            when none (the gateway's spans then join it, as over gRPC)

Kind 2, produce response::

    throttle_time_ms int32  version 2 only: see "Client quotas" below
    error_code      int16   a request-level error (an unknown topic, an invalid request): then
                            partition_count is 0 and every partition of the request failed
    message         string
    partition_count int32   then per partition, ascending:
      partition     int32
      error_code    int16   Kafka's numeric code, 0 = none
      base_offset   int64   offset of the first record appended, -1 on error
      log_append_time int64 -1 unless the topic uses LogAppendTime
      log_start_offset int64
      record_count  int32
      message       string  the error's explanation

Kind 3, fetch request (what the gRPC ``Fetch`` with ``raw_batches`` true asks)::

    isolation_level int8    0 read_uncommitted, 1 read_committed
    max_wait_ms     int32   long-poll bound; 0 answers at once
    min_bytes       int32   answer once this many record bytes are gathered
    max_bytes       int32   bound on the response's record bytes (0 = the gateway's default,
                            3 MiB; the gateway lowers it to its per-connection budget, 64 MiB
                            by default)
    session_id      int32   version 3 only: see "Fetch sessions"; 0 = none
    session_epoch   int32   version 3 only: -1 = no session, 0 = open one, n > 0 = the n-th
                            incremental fetch of ``session_id``
    partition_count int32   then per partition (each at most once); in an incremental fetch
                            only the partitions added to the session or whose fetch_offset or
                            max_bytes changed:
      topic         string
      partition     int32
      fetch_offset  int64
      max_bytes     int32   bound on this partition's record bytes (0 = 1 MiB; the first batch
                            is sent whole anyway)
    forgotten_count int32   version 3 only, 0 unless incremental: then per partition to remove
                            from the session:
      topic         string
      partition     int32
    trace_context   string  W3C ``traceparent``, empty when none (as in a produce request)

Kind 4, fetch response::

    throttle_time_ms int32  version 2 only: see "Client quotas" below
    error_code      int16   a request-level error (then partition_count is 0)
    message         string
    session_id      int32   version 3 only: the session this fetch belongs to (the new one
                            when the request opened one), 0 = none
    partition_count int32   then per partition, in request order (in the session's order, and
                            only the partitions with something to say, for a session's
                            incremental fetch: see "Fetch sessions"):
      topic         string
      partition     int32
      error_code    int16
      high_watermark int64
      log_start_offset int64
      next_offset   int64   where the next fetch of this partition starts
      last_stable_offset int64  -1 unless read_committed
      aborted_count int32   then per aborted transaction overlapping the records
                            (read_committed only):
        producer_id int64
        first_offset int64
      message       string
      records       bytes   whole RecordBatch v2 batches as the storage node stored them;
                            read_committed consumers drop aborted transactions' records
                            themselves, as Kafka consumers do

Fetch sessions (version 3)
--------------------------
Kafka's KIP-227 incremental fetch requests. A consumer of many partitions asks for all of them in
every fetch, while most have nothing new; a *fetch session* lets the gateway remember the
partitions and their positions, so a fetch names only what changed and its answer carries only
the partitions that have something to say. A session belongs to its connection and dies with it.

* ``session_id`` 0, ``session_epoch`` -1: a fetch without a session (as in version 2).
* ``session_epoch`` 0: a *full* fetch that opens a session: the request lists every partition
  (none forgotten), the answer every partition, with the new ``session_id`` (0 when the gateway
  would not open one: too many partitions, see below; the fetch is served all the same). A
  ``session_id`` other than 0 names an older session of the connection that is closed first
  (unknown ids are ignored).
* ``session_epoch`` -1 with a ``session_id``: close that session, then a fetch without one.
* ``session_epoch`` n > 0: an *incremental* fetch of ``session_id``; n is 1 after the full fetch
  and one more after each answered fetch. The gateway applies the request to the session --
  partitions listed are added (at the end of the session's order) or get their new fetch_offset
  and max_bytes; forgotten ones are removed -- then fetches every partition of the session. The
  answer lists a partition only when it brings records, an error, or a high watermark, last
  stable offset or log start offset other than last answered (a partition just added or changed
  always). Then, for every partition answered, the session's fetch_offset becomes the answer's
  ``next_offset``; the others keep theirs. Partitions that brought records move to the end of
  the session's order, so that when the answer's max_bytes is reached, the next fetch starts
  with the others (as a Kafka broker rotates them).

The client keeps the same picture: what it asked for, moved to each answered ``next_offset``. A
partition whose position the client wants elsewhere (a seek, a record dropped by the client) is
listed again with its offset; one it stops fetching (unassigned, its buffer full, backing off) is
forgotten. The request-level errors of a session:

* 70 FETCH_SESSION_ID_NOT_FOUND: the connection has no such session (never opened, evicted, or
  closed because it would grow past the gateway's partition cap, the message says which);
* 71 INVALID_FETCH_SESSION_EPOCH: the epoch is not the one expected, or the session has a fetch
  in flight (one at a time per session).

Either way, and after any request-level error, after an answer the client did not read (a fetch
it gave up on, a timeout) or on a new connection, the client sends a full fetch (epoch 0), which
never fails for session reasons. Bounds: a connection holds at most a few sessions (opening one
more evicts the least recently used), and a session at most a fixed number of partitions (the
gateway's settings; a full fetch over it is served without a session). A gateway that speaks
only version 2 gets no session fields at all.

Kind 127, error (gateway -> client): the connection is about to be closed::

    error_code      int16   e.g. 42 INVALID_REQUEST (a malformed frame), 35 UNSUPPORTED_VERSION
    message         string

``correlation_id`` of an error frame is that of the offending request, or -1 when it could not
be read. Requests the gateway had not answered when it closed are lost to the client, which
fails them with a retriable NETWORK_EXCEPTION (an idempotent producer resends them safely).

Client quotas
-------------
A client over one of its quotas (``tributary quotas``: producer_byte_rate, consumer_byte_rate,
request_percentage) is throttled as Kafka does it since KIP-219: its request is served in full,
the answer carries ``throttle_time_ms`` > 0, and the gateway reads nothing more from the
connection for that long (the requests the client sends meanwhile wait in the socket). A client
should send nothing to that gateway for ``throttle_time_ms`` after reading such an answer. A
version 1 connection is held the same way; its answers just do not say so. An acks=0 produce,
which has no answer, holds the connection all the same.

Error codes are Kafka's numeric codes (``services/errors.py``); messages are explanations for
people, never parsed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from services import errors

MAGIC = 0x54524457
MIN_VERSION = 1
MAX_VERSION = 3
#: The first version whose produce and fetch answers carry throttle_time_ms.
THROTTLE_VERSION = 2
#: The first version with fetch sessions (KIP-227, "Fetch sessions" above).
SESSION_VERSION = 3

#: ``session_id`` of a fetch without a session.
NO_SESSION_ID = 0
#: ``session_epoch`` of a full fetch that opens a session.
INITIAL_EPOCH = 0
#: ``session_epoch`` of a fetch without a session (closing ``session_id``, if any).
FINAL_EPOCH = -1

PRODUCE_REQUEST = 1
PRODUCE_RESPONSE = 2
FETCH_REQUEST = 3
FETCH_RESPONSE = 4
ERROR = 127

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

#: The gateway refuses request frames larger than this (a produce request of 64 MiB of batches).
MAX_REQUEST_FRAME = 64 << 20
#: Clients refuse response frames larger than this (a misbehaving or foreign peer).
MAX_RESPONSE_FRAME = 1 << 30
MAX_TOPIC_BYTES = 249
MAX_CLIENT_ID_BYTES = 1024
#: A traceparent is 55 characters; room for future versions of the header.
MAX_TRACE_CONTEXT_BYTES = 512
#: No correlation id could be read (error frames).
NO_CORRELATION_ID = -1

SIZE = struct.Struct(">i")
HEADER = struct.Struct(">bi")  # kind, correlation_id
_HANDSHAKE_REQUEST = struct.Struct(">ihh")  # magic, min, max (then client_id)
_HANDSHAKE_RESPONSE = struct.Struct(">ihhhhi")  # magic .. max_frame (then message)
_PRODUCE_FIXED = struct.Struct(">bi")  # acks, timeout_ms
_PRODUCE_HEAD = struct.Struct(">ibibih")  # size, kind, correlation_id, acks, timeout_ms, topic_length
_PARTITION_HEAD = struct.Struct(">ii")  # partition, records length
_ONE_PARTITION_HEAD = struct.Struct(">bibih")  # kind, correlation_id, acks, timeout_ms, topic_length
_ONE_PARTITION = struct.Struct(">iii")  # partition_count, partition, records length
_PRODUCE_RESPONSE_PARTITION = struct.Struct(">ihqqqi")  # partition .. record_count
_FETCH_FIXED = struct.Struct(">biii")  # isolation .. max_bytes
_FETCH_PARTITION = struct.Struct(">iqi")  # partition, fetch_offset, max_bytes (after the topic)
_SESSION = struct.Struct(">ii")  # session_id, session_epoch
_FETCH_RESPONSE_PARTITION = struct.Struct(">ihqqqq")  # partition .. last_stable_offset
_ABORTED = struct.Struct(">qq")
#: A produce answer of one partition without errors or messages, as one layout (the fast path):
#: kind, correlation_id, error_code, message_length, partition_count, then the partition's
#: fields and its message_length.
_PLAIN_PRODUCE_RESPONSE = struct.Struct(">bihhiihqqqih")
#: Bytes 5..13 of such a body: no error, an empty message, one partition.
_PLAIN_PREFIX = struct.pack(">hhi", 0, 0, 1)
#: The same answer in version 2 (throttle_time_ms after the correlation id; the prefix at 9..17).
_PLAIN_PRODUCE_RESPONSE_V2 = struct.Struct(">biihhiihqqqih")
_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")
#: The smallest request frame after the handshake: kind and correlation id.
MIN_FRAME = HEADER.size

_ACKS = (0, 1, -1)


# ---- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handshake:
    min_version: int
    max_version: int
    client_id: str = ""
    #: A bearer token, "" when the client sends none.
    auth_token: str = ""


@dataclass(frozen=True, slots=True)
class HandshakeAnswer:
    error_code: int
    version: int
    min_version: int
    max_version: int
    max_frame: int
    message: str = ""

    def error(self) -> errors.TributaryError | None:
        return _error(self.error_code, self.message)


class ProduceRequest(NamedTuple):
    correlation_id: int
    acks: int
    timeout_ms: int
    topic: str
    #: (partition, RecordBatch v2 bytes) in request order.
    partitions: list[tuple[int, bytes | memoryview]]
    #: W3C traceparent, "" = none.
    trace_context: str = ""


class PartitionProduceResult(NamedTuple):
    partition: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    record_count: int = 0
    message: str = ""

    def error(self) -> errors.TributaryError | None:
        return _error(self.error_code, self.message)


class ProduceResponse(NamedTuple):
    correlation_id: int
    error_code: int
    message: str
    partitions: list[PartitionProduceResult]
    #: ms the client is held for going over a quota (version 2; 0 in version 1).
    throttle_time_ms: int = 0

    def error(self) -> errors.TributaryError | None:
        return _error(self.error_code, self.message)


class FetchPartition(NamedTuple):
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0


class FetchRequest(NamedTuple):
    correlation_id: int
    #: Every partition (a full fetch), or those added or changed (an incremental one).
    partitions: list[FetchPartition]
    max_bytes: int = 0
    min_bytes: int = 0
    max_wait_ms: int = 0
    isolation_level: int = READ_UNCOMMITTED
    #: W3C traceparent, "" = none.
    trace_context: str = ""
    #: Version 3: the fetch session (``NO_SESSION_ID``: none) and its epoch (``FINAL_EPOCH``:
    #: no session, ``INITIAL_EPOCH``: open one, n > 0: incremental).
    session_id: int = NO_SESSION_ID
    session_epoch: int = FINAL_EPOCH
    #: Version 3, incremental fetches: (topic, partition) removed from the session.
    forgotten: tuple[tuple[str, int], ...] = ()

    @property
    def incremental(self) -> bool:
        return self.session_epoch > INITIAL_EPOCH


class FetchPartitionResult(NamedTuple):
    topic: str
    partition: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    next_offset: int = -1
    last_stable_offset: int = -1
    aborted: tuple[tuple[int, int], ...] = ()
    message: str = ""
    #: The record bytes (a view into the received frame on the client side).
    records: bytes | memoryview = b""

    def error(self) -> errors.TributaryError | None:
        return _error(self.error_code, self.message)


class FetchResponse(NamedTuple):
    correlation_id: int
    error_code: int
    message: str
    partitions: list[FetchPartitionResult]
    #: ms the client is held for going over a quota (version 2; 0 in version 1).
    throttle_time_ms: int = 0
    #: Version 3: the fetch session the answer belongs to (``NO_SESSION_ID``: none).
    session_id: int = NO_SESSION_ID

    def error(self) -> errors.TributaryError | None:
        return _error(self.error_code, self.message)


class ErrorFrame(NamedTuple):
    correlation_id: int
    error_code: int
    message: str

    def error(self) -> errors.TributaryError:
        error = _error(self.error_code, self.message)
        return error if error is not None else errors.InvalidRequestError(self.message)


def _error(code: int, message: str) -> errors.TributaryError | None:
    if code == 0:
        return None
    return errors.for_kafka_code(code)(message)


def error_code_of(error: errors.TributaryError | None) -> int:
    """The numeric code an error travels as (-1 UNKNOWN_SERVER_ERROR for the root class)."""
    return 0 if error is None else error.kafka_code


# ---- primitives ------------------------------------------------------------------------------


def _string(text: str, limit: int = 32767) -> bytes:
    data = text.encode()
    if len(data) > limit:
        raise ValueError(f"string of {len(data)} bytes exceeds {limit}")
    return _SHORT.pack(len(data)) + data


def _message(text: str) -> bytes:
    """An explanation, cut to what an int16 length can say (on a character boundary)."""
    data = text.encode()
    if len(data) > 32767:
        data = data[:32767].decode(errors="ignore").encode()
    return _SHORT.pack(len(data)) + data


def _frame(kind: int, correlation_id: int, parts: list[bytes]) -> bytes:
    body_size = HEADER.size + sum(len(p) for p in parts)
    return b"".join([SIZE.pack(body_size), HEADER.pack(kind, correlation_id), *parts])


class _Reader:
    """Bounds-checked reads from a frame body; every failure raises ``failure``."""

    __slots__ = ("failure", "position", "view")

    def __init__(self, body: bytes | memoryview, position: int, failure: type[errors.TributaryError]) -> None:
        self.view = memoryview(body)
        self.position = position
        self.failure = failure

    def fail(self, what: str) -> errors.TributaryError:
        return self.failure(f"data frame {what}")

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        end = self.position + layout.size
        if end > len(self.view):
            raise self.fail(f"is truncated inside {what}")
        values = layout.unpack_from(self.view, self.position)
        self.position = end
        return values

    def string(self, what: str, limit: int = 32767) -> str:
        (length,) = self.unpack(_SHORT, what)
        if length < 0 or length > limit:
            raise self.fail(f"has a {what} of length {length} (0..{limit})")
        end = self.position + length
        if end > len(self.view):
            raise self.fail(f"is truncated inside {what}")
        try:
            text = bytes(self.view[self.position : end]).decode()
        except UnicodeDecodeError as exc:
            raise self.fail(f"has a {what} that is not UTF-8") from exc
        self.position = end
        return text

    def blob(self, what: str) -> memoryview:
        (length,) = self.unpack(_INT, what)
        end = self.position + length
        if length < 0 or end > len(self.view):
            raise self.fail(f"has {what} of length {length} beyond the frame")
        data = self.view[self.position : end]
        self.position = end
        return data

    def count(self, what: str, min_entry: int) -> int:
        """An int32 entry count that the rest of the frame can hold (so a huge one costs nothing)."""
        (count,) = self.unpack(_INT, what)
        if count < 0 or count * min_entry > len(self.view) - self.position:
            raise self.fail(f"announces {count} {what} it cannot hold")
        return count

    def finish(self) -> None:
        if self.position != len(self.view):
            raise self.fail(f"has {len(self.view) - self.position} bytes after its end")


def frame_size_ok(size: int, limit: int) -> bool:
    """Whether a frame's size prefix is one a receiver takes (``MIN_FRAME..limit``): the one
    check, for the readers that cut frames from a stream and those that serve them from a
    callback alike."""
    return MIN_FRAME <= size <= limit


def check_frame_size(size: int, limit: int) -> None:
    """Raise InvalidRequestError for a size prefix :func:`frame_size_ok` refuses."""
    if not frame_size_ok(size, limit):
        raise errors.InvalidRequestError(f"data frame size {size} outside {MIN_FRAME}..{limit}")


def decode_header(body: bytes | memoryview) -> tuple[int, int]:
    """(kind, correlation_id) of a frame body; the caller checked ``len(body) >= MIN_FRAME``."""
    kind, correlation_id = HEADER.unpack_from(body)
    return kind, correlation_id


# ---- handshake -------------------------------------------------------------------------------


def encode_handshake(handshake: Handshake) -> bytes:
    body = _HANDSHAKE_REQUEST.pack(MAGIC, handshake.min_version, handshake.max_version) + _string(
        handshake.client_id, MAX_CLIENT_ID_BYTES
    )
    if handshake.auth_token:
        body += _string(handshake.auth_token, MAX_AUTH_TOKEN_BYTES)
    return SIZE.pack(len(body)) + body


#: Longest bearer token in a handshake (a JWT is a few hundred bytes).
MAX_AUTH_TOKEN_BYTES = 8192
#: A handshake frame body is at most this long (fixed part, client id, token); anything longer
#: is refused.
MAX_HANDSHAKE_FRAME = _HANDSHAKE_REQUEST.size + 2 + MAX_CLIENT_ID_BYTES + 2 + MAX_AUTH_TOKEN_BYTES


def decode_handshake(body: bytes | memoryview) -> Handshake:
    """Parse the client's first frame body. InvalidRequestError when it is not a handshake."""
    reader = _Reader(body, 0, errors.InvalidRequestError)
    magic, low, high = reader.unpack(_HANDSHAKE_REQUEST, "the handshake")
    if magic != MAGIC:
        raise errors.InvalidRequestError(f"not a data protocol handshake (magic {magic:#010x})")
    client_id = reader.string("client_id", MAX_CLIENT_ID_BYTES)
    auth_token = (
        reader.string("auth_token", MAX_AUTH_TOKEN_BYTES) if reader.position < len(reader.view) else ""
    )
    reader.finish()
    if low > high:
        raise errors.InvalidRequestError(f"handshake offers versions {low}..{high}")
    return Handshake(low, high, client_id, auth_token)


def choose_version(handshake: Handshake, low: int = MIN_VERSION, high: int = MAX_VERSION) -> int | None:
    """The highest version both sides speak, or None."""
    best = min(handshake.max_version, high)
    return best if best >= max(handshake.min_version, low) else None


def encode_handshake_answer(answer: HandshakeAnswer) -> bytes:
    body = _HANDSHAKE_RESPONSE.pack(
        MAGIC,
        answer.error_code,
        answer.version,
        answer.min_version,
        answer.max_version,
        answer.max_frame,
    ) + _message(answer.message)
    return SIZE.pack(len(body)) + body


def decode_handshake_answer(body: bytes | memoryview) -> HandshakeAnswer:
    """Parse the gateway's answer. CorruptRecordError when it is not one."""
    reader = _Reader(body, 0, errors.CorruptRecordError)
    magic, code, version, low, high, max_frame = reader.unpack(_HANDSHAKE_RESPONSE, "the handshake answer")
    if magic != MAGIC:
        raise errors.CorruptRecordError(f"not a data protocol handshake answer (magic {magic:#010x})")
    message = reader.string("message")
    reader.finish()
    return HandshakeAnswer(code, version, low, high, max_frame, message)


# ---- produce ---------------------------------------------------------------------------------


def encode_produce_request(request: ProduceRequest) -> bytes:
    """The request frame. One ``pack`` per partition and one join: this runs once per request
    on the SDK's send path."""
    topic = request.topic.encode()
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic of {len(topic)} bytes exceeds {MAX_TOPIC_BYTES}")
    parts: list[bytes | memoryview] = [b"", topic, _INT.pack(len(request.partitions))]
    size = _PRODUCE_HEAD.size - SIZE.size + len(topic) + _INT.size
    for partition, data in request.partitions:
        parts.append(_PARTITION_HEAD.pack(partition, len(data)))
        parts.append(data)
        size += _PARTITION_HEAD.size + len(data)
    trace_context = _string(request.trace_context, MAX_TRACE_CONTEXT_BYTES)
    parts.append(trace_context)
    size += len(trace_context)
    parts[0] = _PRODUCE_HEAD.pack(
        size, PRODUCE_REQUEST, request.correlation_id, request.acks, request.timeout_ms, len(topic)
    )
    return b"".join(parts)


def decode_produce_request(body: bytes | memoryview) -> ProduceRequest:
    """Parse a kind-1 frame body (header included). InvalidRequestError on bad input.

    The partitions' bytes are views into ``body`` (no copy). The usual frame -- one partition,
    no trace context -- is read with two ``unpack_from`` calls (a fifth of the gateway's time
    per one-record request went to the general parse); anything else, and any frame that
    would fail, takes the general parse, which says what is wrong.
    """
    size = len(body)
    if size >= _ONE_PARTITION_HEAD.size:
        _, correlation_id, acks, timeout_ms, topic_length = _ONE_PARTITION_HEAD.unpack_from(body)
        position = _ONE_PARTITION_HEAD.size + topic_length
        if 0 <= topic_length <= MAX_TOPIC_BYTES and position + _ONE_PARTITION.size <= size:
            count, partition, length = _ONE_PARTITION.unpack_from(body, position)
            start = position + _ONE_PARTITION.size
            end = start + length
            if (
                count == 1
                and partition >= 0
                and length >= 0
                and end + 2 == size
                and body[end] == 0
                and body[end + 1] == 0  # an empty trace context, the frame's end
                and acks in _ACKS
                and timeout_ms >= 0
            ):
                try:
                    topic = bytes(body[_ONE_PARTITION_HEAD.size : position]).decode()
                except UnicodeDecodeError:
                    pass
                else:
                    records = memoryview(body)[start:end]
                    return ProduceRequest(correlation_id, acks, timeout_ms, topic, [(partition, records)], "")
    return _decode_produce_request(body)


def _decode_produce_request(body: bytes | memoryview) -> ProduceRequest:
    """:func:`decode_produce_request`'s general parse."""
    _, correlation_id = decode_header(body)
    reader = _Reader(body, HEADER.size, errors.InvalidRequestError)
    acks, timeout_ms = reader.unpack(_PRODUCE_FIXED, "the produce header")
    if acks not in _ACKS:
        raise errors.InvalidRequestError(f"produce request acks {acks} is not 0, 1 or -1")
    if timeout_ms < 0:
        raise errors.InvalidRequestError(f"produce request timeout_ms {timeout_ms} is negative")
    topic = reader.string("topic", MAX_TOPIC_BYTES)
    count = reader.count("partitions", 8)
    partitions: list[tuple[int, bytes | memoryview]] = []
    seen: set[int] = set()
    for _ in range(count):
        (partition,) = reader.unpack(_INT, "a partition")
        if partition < 0 or partition in seen:
            raise errors.InvalidRequestError(f"produce request partition {partition} is negative or repeated")
        seen.add(partition)
        partitions.append((partition, reader.blob("records")))
    trace_context = reader.string("trace_context", MAX_TRACE_CONTEXT_BYTES)
    reader.finish()
    return ProduceRequest(correlation_id, acks, timeout_ms, topic, partitions, trace_context)


def _throttle_part(throttle_time_ms: int, version: int) -> list[bytes]:
    """The version-2 throttle_time_ms field, or nothing in version 1."""
    return [_INT.pack(throttle_time_ms)] if version >= THROTTLE_VERSION else []


def encode_produce_response(response: ProduceResponse, version: int = MAX_VERSION) -> bytes:
    parts = [
        *_throttle_part(response.throttle_time_ms, version),
        _SHORT.pack(response.error_code),
        _message(response.message),
        _INT.pack(len(response.partitions)),
    ]
    for p in response.partitions:
        parts.append(
            _PRODUCE_RESPONSE_PARTITION.pack(
                p.partition,
                p.error_code,
                p.base_offset,
                p.log_append_time,
                p.log_start_offset,
                p.record_count,
            )
        )
        parts.append(_message(p.message))
    return _frame(PRODUCE_RESPONSE, response.correlation_id, parts)


def decode_produce_response(body: bytes | memoryview, version: int = MAX_VERSION) -> ProduceResponse:
    """Parse a kind-2 frame body (header included) of a connection speaking ``version``.
    CorruptRecordError on bad input."""
    throttled = version >= THROTTLE_VERSION
    plain, prefix_at = (_PLAIN_PRODUCE_RESPONSE_V2, 9) if throttled else (_PLAIN_PRODUCE_RESPONSE, 5)
    if len(body) == plain.size and body[prefix_at : prefix_at + 8] == _PLAIN_PREFIX:
        # The common answer, one partition without messages: one unpack (the SDK's hot path).
        values = plain.unpack(body)
        throttle_time_ms = values[2] if throttled else 0
        partition, code, base, append_time, start, records, length = values[-7:]
        if length != 0:
            raise errors.CorruptRecordError("data frame has a message beyond its end")
        return ProduceResponse(
            values[1],
            0,
            "",
            [PartitionProduceResult(partition, code, base, append_time, start, records)],
            throttle_time_ms,
        )
    _, correlation_id = decode_header(body)
    reader = _Reader(body, HEADER.size, errors.CorruptRecordError)
    throttle_time_ms = _read_throttle(reader, version)
    (code,) = reader.unpack(_SHORT, "the error code")
    message = reader.string("message")
    count = reader.count("partitions", _PRODUCE_RESPONSE_PARTITION.size + 2)
    partitions = []
    for _ in range(count):
        partition, code_, base, append_time, start, records = reader.unpack(
            _PRODUCE_RESPONSE_PARTITION, "a partition result"
        )
        partitions.append(
            PartitionProduceResult(
                partition, code_, base, append_time, start, records, reader.string("message")
            )
        )
    reader.finish()
    return ProduceResponse(correlation_id, code, message, partitions, throttle_time_ms)


def _read_throttle(reader: _Reader, version: int) -> int:
    if version < THROTTLE_VERSION:
        return 0
    (throttle_time_ms,) = reader.unpack(_INT, "throttle_time_ms")
    if throttle_time_ms < 0:
        raise reader.fail(f"has a negative throttle_time_ms {throttle_time_ms}")
    return throttle_time_ms


# ---- fetch -----------------------------------------------------------------------------------


def encode_fetch_request(request: FetchRequest, version: int = MAX_VERSION) -> bytes:
    """The request frame in ``version``. ValueError when the request uses a session and the
    version has none."""
    parts = [
        _FETCH_FIXED.pack(request.isolation_level, request.max_wait_ms, request.min_bytes, request.max_bytes)
    ]
    if version >= SESSION_VERSION:
        parts.append(_SESSION.pack(request.session_id, request.session_epoch))
    elif request.session_epoch != FINAL_EPOCH or request.forgotten:
        raise ValueError(f"fetch sessions need protocol version {SESSION_VERSION}, not {version}")
    parts.append(_INT.pack(len(request.partitions)))
    for p in request.partitions:
        parts.append(_string(p.topic, MAX_TOPIC_BYTES))
        parts.append(_FETCH_PARTITION.pack(p.partition, p.fetch_offset, p.max_bytes))
    if version >= SESSION_VERSION:
        parts.append(_INT.pack(len(request.forgotten)))
        for topic, partition in request.forgotten:
            parts.append(_string(topic, MAX_TOPIC_BYTES))
            parts.append(_INT.pack(partition))
    parts.append(_string(request.trace_context, MAX_TRACE_CONTEXT_BYTES))
    return _frame(FETCH_REQUEST, request.correlation_id, parts)


def decode_fetch_request(body: bytes | memoryview, version: int = MAX_VERSION) -> FetchRequest:
    """Parse a kind-3 frame body (header included) of a connection speaking ``version``.
    InvalidRequestError on bad input."""
    _, correlation_id = decode_header(body)
    reader = _Reader(body, HEADER.size, errors.InvalidRequestError)
    isolation, max_wait_ms, min_bytes, max_bytes = reader.unpack(_FETCH_FIXED, "the fetch header")
    if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise errors.InvalidRequestError(f"fetch request isolation level {isolation} is not 0 or 1")
    if max_wait_ms < 0 or min_bytes < 0 or max_bytes < 0:
        raise errors.InvalidRequestError("fetch request has a negative wait or size")
    session_id, epoch = _read_session(reader) if version >= SESSION_VERSION else (NO_SESSION_ID, FINAL_EPOCH)
    count = reader.count("partitions", 2 + _FETCH_PARTITION.size)
    partitions = []
    seen: set[tuple[str, int]] = set()
    for _ in range(count):
        topic = reader.string("topic", MAX_TOPIC_BYTES)
        partition, offset, partition_max = reader.unpack(_FETCH_PARTITION, "a partition")
        if partition < 0 or partition_max < 0:
            raise errors.InvalidRequestError(f"{topic}-{partition}: negative partition or max_bytes")
        if (topic, partition) in seen:
            raise errors.InvalidRequestError(f"{topic}-{partition} appears twice in the fetch request")
        seen.add((topic, partition))
        partitions.append(FetchPartition(topic, partition, offset, partition_max))
    forgotten = _read_forgotten(reader, epoch, seen) if version >= SESSION_VERSION else ()
    trace_context = reader.string("trace_context", MAX_TRACE_CONTEXT_BYTES)
    reader.finish()
    return FetchRequest(
        correlation_id,
        partitions,
        max_bytes,
        min_bytes,
        max_wait_ms,
        isolation,
        trace_context,
        session_id,
        epoch,
        forgotten,
    )


def _read_session(reader: _Reader) -> tuple[int, int]:
    session_id, epoch = reader.unpack(_SESSION, "the fetch session")
    if session_id < 0 or epoch < FINAL_EPOCH:
        raise errors.InvalidRequestError(f"fetch session {session_id} epoch {epoch}: negative")
    if session_id == NO_SESSION_ID and epoch > INITIAL_EPOCH:
        raise errors.InvalidRequestError(f"incremental fetch (epoch {epoch}) without a session id")
    return session_id, epoch


def _read_forgotten(
    reader: _Reader, epoch: int, fetched: set[tuple[str, int]]
) -> tuple[tuple[str, int], ...]:
    count = reader.count("forgotten partitions", 2 + _INT.size)
    if count and epoch <= INITIAL_EPOCH:
        raise errors.InvalidRequestError("a fetch that is not incremental forgets partitions")
    forgotten = []
    for _ in range(count):
        topic = reader.string("topic", MAX_TOPIC_BYTES)
        (partition,) = reader.unpack(_INT, "a forgotten partition")
        if (topic, partition) in fetched:
            raise errors.InvalidRequestError(f"{topic}-{partition} is both fetched and forgotten")
        forgotten.append((topic, partition))
    return tuple(forgotten)


def encode_fetch_response_parts(
    response: FetchResponse, version: int = MAX_VERSION
) -> list[bytes | memoryview]:
    """The response frame as a list of buffers to write in order (``writelines``): the records
    of each partition are passed through as they are, never copied into one frame."""
    parts: list[bytes | memoryview] = [
        b"",  # size and header, filled in below
        *_throttle_part(response.throttle_time_ms, version),
        _SHORT.pack(response.error_code),
        _message(response.message),
        *([_INT.pack(response.session_id)] if version >= SESSION_VERSION else []),
        _INT.pack(len(response.partitions)),
    ]
    for p in response.partitions:
        fixed = [
            _string(p.topic, MAX_TOPIC_BYTES),
            _FETCH_RESPONSE_PARTITION.pack(
                p.partition,
                p.error_code,
                p.high_watermark,
                p.log_start_offset,
                p.next_offset,
                p.last_stable_offset,
            ),
            _INT.pack(len(p.aborted)),
        ]
        fixed.extend(_ABORTED.pack(producer_id, first) for producer_id, first in p.aborted)
        fixed.append(_message(p.message))
        fixed.append(_INT.pack(len(p.records)))
        parts.append(b"".join(fixed))
        if len(p.records):
            parts.append(p.records)
    body_size = HEADER.size + sum(len(part) for part in parts)
    parts[0] = SIZE.pack(body_size) + HEADER.pack(FETCH_RESPONSE, response.correlation_id)
    return parts


def encode_fetch_response(response: FetchResponse, version: int = MAX_VERSION) -> bytes:
    return b"".join(encode_fetch_response_parts(response, version))


def decode_fetch_response(body: bytes | memoryview, version: int = MAX_VERSION) -> FetchResponse:
    """Parse a kind-4 frame body (header included) of a connection speaking ``version``.
    CorruptRecordError on bad input.

    Each partition's ``records`` is a view into ``body`` (no copy).
    """
    _, correlation_id = decode_header(body)
    reader = _Reader(body, HEADER.size, errors.CorruptRecordError)
    throttle_time_ms = _read_throttle(reader, version)
    (code,) = reader.unpack(_SHORT, "the error code")
    message = reader.string("message")
    session_id = NO_SESSION_ID
    if version >= SESSION_VERSION:
        (session_id,) = reader.unpack(_INT, "the session id")
    count = reader.count("partitions", 2 + _FETCH_RESPONSE_PARTITION.size + 4 + 2 + 4)
    partitions = []
    for _ in range(count):
        topic = reader.string("topic", MAX_TOPIC_BYTES)
        partition, code_, high, start, next_offset, stable = reader.unpack(
            _FETCH_RESPONSE_PARTITION, "a partition result"
        )
        aborted_count = reader.count("aborted transactions", _ABORTED.size)
        aborted = tuple(reader.unpack(_ABORTED, "an aborted transaction") for _ in range(aborted_count))
        partition_message = reader.string("message")
        records = reader.blob("records")
        partitions.append(
            FetchPartitionResult(
                topic, partition, code_, high, start, next_offset, stable, aborted, partition_message, records
            )
        )
    reader.finish()
    return FetchResponse(correlation_id, code, message, partitions, throttle_time_ms, session_id)


# ---- errors ----------------------------------------------------------------------------------


def encode_error(correlation_id: int, error: errors.TributaryError) -> bytes:
    return _frame(ERROR, correlation_id, [_SHORT.pack(error.kafka_code), _message(error.message)])


def decode_error(body: bytes | memoryview) -> ErrorFrame:
    _, correlation_id = decode_header(body)
    reader = _Reader(body, HEADER.size, errors.CorruptRecordError)
    (code,) = reader.unpack(_SHORT, "the error code")
    message = reader.string("message")
    reader.finish()
    return ErrorFrame(correlation_id, code, message)
