"""The SDK's raw data path: produce and fetch over the gateway's data listener (``services/dataport``).

A gateway that offers the raw data protocol says where in its GetMetadata answer
(``data_address``). The producer's :class:`RawTransport` and the consumer's fetcher then send
their requests as frames on one TCP connection each instead of gRPC messages (a gRPC message
costs Python ~0.13 ms on each side; a frame a few microseconds), and fall back to gRPC when the
gateway offers nothing or refuses every version the SDK speaks. The setting is
``data_path``: ``"auto"`` (the default: raw when offered) or ``"grpc"``.

Error semantics are the produce stream's (``transport.py``): when the connection breaks, every
request waiting on it fails with a retriable ``NetworkError`` (an idempotent producer resends
them safely; the gateway may have appended some, as over a broken stream), and the next request
opens a new connection, looking the address up again (the gateway may have moved, or another
gateway answers). An error frame from the gateway fails the request it names with its error and
the others with ``NetworkError``. A request not answered within its timeout marks the
connection stuck: it and every request waiting on it fail with a retriable
``RequestTimedOutError`` and the next request opens a new connection. acks=0 requests are done
once written, as in Kafka.

Client quotas: an answer's ``throttle_time_ms`` (protocol version 2) holds the link's next
requests that long (:mod:`gateway.client.throttle`); they wait in order, under the link's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import NamedTuple

from opentelemetry import trace

from gateway.client.answer_reader import AnswerReader
from gateway.client.client import GatewayClient
from gateway.client.credentials import TokenSource
from gateway.client.errors import (
    NetworkError,
    RequestTimedOutError,
    TributaryError,
    UnsupportedVersionError,
)
from gateway.client.fetch_session import FetchSessionState
from gateway.client.throttle import Throttles
from services import errors
from services.acks import Acks
from services.correlation_ids import correlation_ids
from services.dataport import protocol as dp
from services.proto import pb
from services.serde import acks_from_proto
from services.telemetry import inject_metadata
from services.tls import ClientTls, client_ssl_context

log = logging.getLogger(__name__)

DATA_PATHS = ("auto", "grpc")
#: Kafka's connections.max.idle.ms for clients (9 min), a minute under the gateway's 10.
DEFAULT_MAX_IDLE_S = 540.0
#: Stop writing (await the socket) while this many request bytes wait to be sent.
_WRITE_HIGH_WATER = 4 << 20
#: A data connection's read buffer: the most one socket read takes. Every produce answer and
#: small fetch answers are cut from it; a larger answer is received into a buffer of its own size
#: (``gateway/client/answer_reader.py``). asyncio's default read (256 KiB into a new bytes
#: object) cost a 256 KiB allocation per recv -- above glibc's mmap threshold an mmap and munmap,
#: ~12 us for a 60-byte produce answer (measured on this project's 2-core VM).
READ_BUFFER_BYTES = 64 * 1024
_UNSPECIFIED_HOSTS = ("", "0.0.0.0", "::", "[::]")


def current_traceparent() -> str:
    """The W3C traceparent of the current span ("" when there is none: telemetry off), so the
    gateway's spans of a raw request join the trace as they do over gRPC (see
    ``gateway/client/telemetry.py``: the sender runs each request in its first record's span)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    for key, value in inject_metadata():
        if key == "traceparent":
            return value if isinstance(value, str) else value.decode()
    return ""


def parse_data_path(value: str) -> str:
    if value not in DATA_PATHS:
        raise ValueError(f"data_path must be one of {', '.join(DATA_PATHS)}, not {value!r}")
    return value


async def discover(client: GatewayClient, topic: str) -> tuple[str, int] | None:
    """The (host, port) of the current gateway's data listener, or None when it has none."""
    response = await client.call_with_retry(
        "GetMetadata", pb.GetMetadataRequest(topics=[topic] if topic else [])
    )
    address = response.data_address
    if not address:
        return None
    host, _, port = address.rpartition(":")
    if host in _UNSPECIFIED_HOSTS:
        host = client.pool.current().address.rpartition(":")[0]
    return host.strip("[]"), int(port)


class AnswerSlot:
    """Where the answer to a request the producer's sender wrote directly goes: the answer's
    body (or the error that ended the wait) is handed to ``callback(body, error)`` at once, in
    the read routine's own turn -- an asyncio future would run it a loop turn later, with one
    request at a time a turn per round trip. Has what the connection's reading and breaking
    use of a future (``done``, ``set_result``, ``set_exception``), and ``cancel``."""

    __slots__ = ("_callback", "_done")

    def __init__(self, callback: Callable[[bytes | memoryview | None, BaseException | None], None]) -> None:
        self._callback = callback
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, body: bytes | memoryview) -> None:
        self._settle(body, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def cancel(self) -> None:
        self._settle(None, asyncio.CancelledError())

    def _settle(self, body: bytes | memoryview | None, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._callback(body, error)
        except Exception:  # the read routine (or whoever broke the connection) must go on
            log.exception("error settling a produce answer")


class DataConnection:
    """One handshaken connection with its unanswered requests by correlation id."""

    def __init__(
        self,
        address: str,
        writer: asyncio.StreamWriter,
        reader: AnswerReader,
        version: int = dp.MAX_VERSION,
    ) -> None:
        self.address = address
        #: The protocol version agreed in the handshake (answers are decoded by it).
        self.version = version
        self.writer = writer
        #: The connection's protocol: it hands each answer frame to :meth:`_answered` as it comes.
        self.reader = reader
        self.pending: dict[int, asyncio.Future | AnswerSlot] = {}
        self.broken = False
        self._correlation = correlation_ids()
        #: Frames written in this loop iteration, sent together at its end (``_queue_write``).
        self._corked: list[bytes] = []
        self._corked_bytes = 0
        self._flush_scheduled = False
        #: Set by :meth:`hold_writes`: queued frames wait for :meth:`flush` (no turn scheduled).
        self._holding = False
        #: The connection's event loop (asked once: asking costs a system call in 3.11).
        self._loop = asyncio.get_running_loop()
        #: Event-loop time of the last write or answer.
        self.last_active = self._loop.time()
        reader.attach(self._answered, self._lost)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str,
        timeout_s: float,
        tls: ClientTls | None = None,
        token_source: TokenSource | None = None,
        read_size: int = READ_BUFFER_BYTES,
    ) -> DataConnection:
        """Connect and handshake. NetworkError when the gateway cannot be reached,
        UnsupportedVersionError when it speaks none of our versions, SaslAuthenticationFailedError
        when it refuses our token. ``read_size``: the connection's read buffer (the most one
        socket read takes; a larger answer is received into a buffer of its own size)."""
        address = f"{host}:{port}"
        # The provider may fetch from an identity provider: not on the event loop.
        token = await asyncio.to_thread(token_source.token) if token_source is not None else ""
        loop = asyncio.get_running_loop()
        reader = AnswerReader(loop, buffer_size=read_size, max_frame=dp.MAX_RESPONSE_FRAME, first_max=1 << 16)
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(
                    lambda: reader,
                    host,
                    port,
                    ssl=client_ssl_context(tls) if tls is not None else None,
                    server_hostname=host if tls is not None else None,
                ),
                timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise NetworkError(f"gateway data listener {address} unreachable: {exc!r}") from exc
        writer = asyncio.StreamWriter(transport, reader, None, loop)
        try:
            writer.write(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, dp.MAX_VERSION, client_id, token)))
            answer = _read_handshake_answer(await asyncio.wait_for(asyncio.shield(reader.first), timeout_s))
        except (OSError, TimeoutError, EOFError, errors.TributaryError) as exc:
            transport.abort()
            if isinstance(exc, errors.TributaryError) and not isinstance(exc, errors.CorruptRecordError):
                raise
            raise NetworkError(f"handshake with gateway data listener {address} failed: {exc!r}") from exc
        error = answer.error()
        if error is not None:
            transport.abort()
            raise error
        return cls(address, writer, reader, answer.version)

    def next_correlation_id(self) -> int:
        return next(self._correlation)

    async def send(self, frame: bytes, correlation_id: int | None) -> asyncio.Future | None:
        """Write one frame; the future of its answer's body unless ``correlation_id`` is None
        (an acks=0 produce). Raises NetworkError on a broken connection."""
        future = self.send_nowait(frame, correlation_id)
        assert future is None or isinstance(future, asyncio.Future)
        if self.backlogged():
            self._flush()
            try:
                await self.writer.drain()
            except (OSError, RuntimeError) as exc:
                self.break_(NetworkError(f"data connection to {self.address} broke: {exc!r}"))
        if self.broken and (future is None or not future.done()):
            raise NetworkError(f"data connection to {self.address} closed before the request was sent")
        return future

    def send_nowait(
        self, frame: bytes, correlation_id: int | None, answer: AnswerSlot | None = None
    ) -> asyncio.Future | AnswerSlot | None:
        """:meth:`send` without waiting for the socket to take the bytes: the frame is queued
        for this loop iteration's write (or :meth:`flush`), whatever is already waiting. The
        answer goes to ``answer`` when given, else to a new future. Raises NetworkError on a
        broken connection."""
        if self.broken:
            raise NetworkError(f"data connection to {self.address} is closed")
        loop = self._loop
        self.last_active = loop.time()
        future: asyncio.Future | AnswerSlot | None = None
        if correlation_id is not None:
            future = loop.create_future() if answer is None else answer
            self.pending[correlation_id] = future
        self._queue_write(frame)
        return future

    async def drain_if_backlogged(self) -> None:
        """Await the socket while :meth:`backlogged` (breaking the connection if it fails: the
        requests waiting on it then fail with the error)."""
        if self.backlogged():
            self._flush()
            try:
                await self.writer.drain()
            except (OSError, RuntimeError) as exc:
                self.break_(NetworkError(f"data connection to {self.address} broke: {exc!r}"))

    def backlogged(self) -> bool:
        """Whether more request bytes wait to be sent than the connection lets pile up: the next
        writer awaits the socket (:meth:`send`)."""
        return self._corked_bytes + self.writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER

    def flush(self) -> None:
        """Write the queued frames now (one ``writelines``) instead of at the end of this loop
        iteration: the sender's pass calls it once its requests are queued, so they leave a loop
        iteration sooner. Ends :meth:`hold_writes`."""
        self._holding = False
        self._flush()

    def hold_writes(self) -> None:
        """The caller queues frames and then calls :meth:`flush` itself (in a ``finally``),
        before it returns to the loop: no write is scheduled for the end of the loop iteration
        meanwhile -- that one found nothing left to write, and cost a turn of the loop (a
        system call) per request of a one-at-a-time producer."""
        self._holding = True

    def _queue_write(self, frame: bytes) -> None:
        """Queue ``frame`` for the write at the end of this loop iteration: requests started
        together (the sender starts up to ``max_in_flight`` at once) leave in one syscall, and
        the gateway reads them in one read, instead of one each."""
        self._corked.append(frame)
        self._corked_bytes += len(frame)
        if not self._flush_scheduled and not self._holding:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._corked:
            return
        frames, self._corked, self._corked_bytes = self._corked, [], 0
        if not self.broken:
            self.writer.writelines(frames)

    def _answered(self, body: bytes | memoryview) -> None:
        """An answer frame came (in the socket's callback): settle the request it names."""
        if self.broken:
            return
        try:
            kind, correlation_id = dp.decode_header(body)
            if kind == dp.ERROR:
                frame = dp.decode_error(body)
                self.break_(frame.error(), only=frame.correlation_id)
                return
        except errors.TributaryError as exc:
            self.break_(NetworkError(f"data connection to {self.address}: bad frame from the gateway: {exc}"))
            return
        self.last_active = self._loop.time()
        future = self.pending.pop(correlation_id, None)
        if future is not None and not future.done():
            future.set_result(body)

    def _lost(self, error: BaseException) -> None:
        """The connection ended (the gateway closed it, it broke, or an unreadable frame)."""
        if isinstance(error, errors.TributaryError) and not isinstance(error, NetworkError):
            error = NetworkError(f"data connection to {self.address}: bad frame from the gateway: {error}")
        elif not isinstance(error, TributaryError):
            error = NetworkError(f"data connection to {self.address} closed by the gateway")
        self.break_(error)

    def break_(self, error: TributaryError, *, only: int | None = None) -> None:
        """Fail every unanswered request and stop using the connection. With ``only`` (an error
        frame naming a request) that request gets ``error``, the others a NetworkError."""
        self.broken = True
        self.writer.transport.abort()
        pending, self.pending = self.pending, {}
        for correlation_id, future in pending.items():
            if future.done():
                continue
            if only is not None and correlation_id != only:
                future.set_exception(NetworkError(f"data connection to {self.address} closed: {error}"))
            else:
                future.set_exception(error)

    async def close(self, timeout_s: float) -> None:
        """Let the gateway read what was written (up to ``timeout_s``), then close."""
        if not self.broken:
            self._flush()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.writer.drain(), timeout_s)
                self.writer.close()
                await asyncio.wait_for(self.writer.wait_closed(), timeout_s)
        self.break_(NetworkError("closed by the client"))


def _read_handshake_answer(body: bytes) -> dp.HandshakeAnswer:
    if body[:1] == bytes([dp.ERROR]):  # the gateway refuses the connection (too many open)
        raise NetworkError(
            f"the gateway's data listener refused the connection: {dp.decode_error(body).error()}"
        )
    return dp.decode_handshake_answer(body)


class DataLink:
    """The client's way to its gateway's data listener: a connection opened on first use (and
    again after it broke), or None for good once the gateway offered none or refused us."""

    def __init__(
        self,
        client: GatewayClient,
        *,
        connect_timeout_s: float = 10.0,
        max_idle_s: float | None = DEFAULT_MAX_IDLE_S,
        throttles: Throttles | None = None,
    ) -> None:
        self._client = client
        #: What the gateway asked to wait for (None: nothing is waited for).
        self.throttles = throttles
        self._connect_timeout_s = connect_timeout_s
        #: A connection idle this long is closed before the next request (None: never).
        self._max_idle_s = max_idle_s
        self._retiring: set[asyncio.Task] = set()
        self._connection: DataConnection | None = None
        self._lock = asyncio.Lock()
        #: True once the gRPC path is to be used (no listener offered, or no common version).
        self.unavailable = False
        #: Connections opened so far (more than one: the path broke and was reopened).
        self.opened = 0

    async def connection(self, topic: str) -> DataConnection | None:
        """The open connection (opened now if needed), or None: use gRPC. While the gateway
        holds this client (``throttle_time_ms``), it is handed out once the hold is over.

        Always through the lock, which is FIFO and free of charge when nobody waits: a request
        arriving while the connection is being opened, or while the client is throttled, must
        not overtake those waiting for it (the order requests are written in is the order they
        are appended in)."""
        async with self._lock:
            connection = await self._connection_locked(topic)
            if connection is not None and self.throttles is not None:
                await self.throttles.of(connection.address).wait()
            return connection

    def connection_now(self) -> DataConnection | None:
        """The open connection when a request may be written on it at once without awaiting
        anything, else None (take :meth:`connection`): no connection yet or a broken one,
        requests queued on the lock (they go first), the gateway holding this client, or the
        connection idle long enough to be retired."""
        connection = self._connection
        if connection is None or connection.broken or self._lock.locked():
            return None
        if (
            self._max_idle_s is not None
            and not connection.pending
            and asyncio.get_running_loop().time() - connection.last_active >= self._max_idle_s
        ):
            return None
        if self.throttles is not None and self.throttles.of(connection.address).remaining_s() > 0:
            return None
        return connection

    def observe(self, connection: DataConnection, throttle_time_ms: int) -> None:
        """An answer on ``connection`` and the throttle time it carried."""
        if self.throttles is not None:
            self.throttles.of(connection.address).observe(throttle_time_ms)

    async def _connection_locked(self, topic: str) -> DataConnection | None:
        self._maybe_retire_idle()
        if self._connection is not None and not self._connection.broken:
            return self._connection
        if self.unavailable:
            return None
        address = await discover(self._client, topic)
        if address is None:
            log.info("the gateway offers no raw data listener; using gRPC")
            self.unavailable = True
            return None
        try:
            self._connection = await DataConnection.open(
                *address,
                client_id=self._client.client_id,
                timeout_s=self._connect_timeout_s,
                tls=self._client.tls,
                token_source=self._client.token_source,
            )
        except UnsupportedVersionError as exc:
            log.info("the gateway's data listener refused us (%s); using gRPC", exc)
            self.unavailable = True
            return None
        self.opened += 1
        return self._connection

    def _maybe_retire_idle(self) -> None:
        """Close a connection idle ``max_idle_s`` before using it: the gateway closes idle ones
        (its ``data_max_idle_ms``, 10 min; ours is 9, as the stream transport's), and a request
        written the moment it does would be lost (silently, at acks=0)."""
        connection = self._connection
        if (
            connection is None
            or connection.broken
            or self._max_idle_s is None
            or connection.pending
            or asyncio.get_running_loop().time() - connection.last_active < self._max_idle_s
        ):
            return
        self._connection = None
        task = asyncio.get_running_loop().create_task(connection.close(5.0))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self, timeout_s: float) -> None:
        connection, self._connection = self._connection, None
        if self._retiring:
            await asyncio.wait(self._retiring, timeout=timeout_s)
        if connection is not None:
            await connection.close(timeout_s)


# ---- produce ---------------------------------------------------------------------------------


def _unacked_response(request):
    return pb.ProduceResponse(
        topic=request.topic,
        correlation_id=request.correlation_id,
        partitions=[
            pb.PartitionProduceResult(
                partition=entry.partition, base_offset=-1, log_append_time=-1, log_start_offset=-1
            )
            for entry in request.batches
        ],
    )


class _ErrorAnswer(NamedTuple):
    """What ``services.serde.error_from_proto`` reads of a ``pb.Error``."""

    reason: str
    message: str


class _PartitionAnswer:
    """What the sender reads of a ``pb.PartitionProduceResult``."""

    __slots__ = ("base_offset", "error", "log_append_time", "log_start_offset", "partition", "record_count")

    def __init__(self, result: dp.PartitionProduceResult, error: errors.TributaryError | None) -> None:
        self.partition = result.partition
        self.base_offset = result.base_offset
        self.log_append_time = result.log_append_time
        self.log_start_offset = result.log_start_offset
        self.record_count = result.record_count
        self.error = _ErrorAnswer(error.reason, error.message) if error is not None else None

    def HasField(self, name: str) -> bool:
        return name == "error" and self.error is not None


class ProduceAnswer:
    """A raw produce answer as the sender reads a ``pb.ProduceResponse`` (``partitions`` with
    ``partition``, offsets and ``HasField("error")``), built without protobuf: on the raw path
    that saves ~10 us per request. A request-level error goes on partition -1, as ProduceStream
    answers a request that failed as a whole."""

    __slots__ = ("correlation_id", "partitions", "throttle_time_ms", "topic")

    def __init__(self, topic: str, answer: dp.ProduceResponse) -> None:
        self.topic = topic
        self.correlation_id = answer.correlation_id
        self.throttle_time_ms = answer.throttle_time_ms
        self.partitions = [_PartitionAnswer(p, p.error()) for p in answer.partitions]
        whole = answer.error()
        if whole is not None:
            self.partitions.insert(0, _PartitionAnswer(dp.PartitionProduceResult(-1), whole))


class RawTransport:
    """Produce requests as frames on the data listener; ``fallback`` (a gRPC transport) when
    the gateway offers no listener. Requests on the connection are appended to each partition
    in the order they were written, so it pipelines like the ProduceStream."""

    @property
    def preserves_order(self) -> bool:
        """Requests keep their order on the data connection; once the producer uses gRPC for
        good, as its fallback does (the stream: yes; unary calls: no)."""
        return self.using_raw or bool(getattr(self._fallback, "preserves_order", False))

    def __init__(
        self, client: GatewayClient, fallback, *, max_idle_s: float | None = DEFAULT_MAX_IDLE_S
    ) -> None:
        self._client = client
        self._link = DataLink(client, max_idle_s=max_idle_s, throttles=client.produce_throttles)
        self._fallback = fallback

    @property
    def using_raw(self) -> bool:
        """False once the producer uses gRPC for good (nothing offered, or refused)."""
        return not self._link.unavailable

    @property
    def connections_opened(self) -> int:
        """Data connections opened so far (a broken one is replaced by a new one)."""
        return self._link.opened

    async def send(self, request, timeout_s: float):
        connection = await self._link.connection(request.topic)
        if connection is None:
            return await self._fallback.send(request, timeout_s)
        acks = int(acks_from_proto(request.acks))
        correlation_id = connection.next_correlation_id()
        request.correlation_id = correlation_id
        frame = dp.encode_produce_request(
            dp.ProduceRequest(
                correlation_id,
                acks,
                request.timeout_ms,
                request.topic,
                [(entry.partition, entry.record_batches) for entry in request.batches],
                current_traceparent(),
            )
        )
        if acks == Acks.NONE:
            await connection.send(frame, None)
            return _unacked_response(request)
        future = await connection.send(frame, correlation_id)
        assert future is not None
        try:
            body = await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self.answer_late(connection, timeout_s)
            body = await future
        return self.read_answer(connection, request.topic, body)

    # -- the sender's direct path (``Sender._write_direct``) -----------------------------------
    #
    # NOTE: a request through ``send`` costs a task, a protobuf request (and, at acks=0, a
    # protobuf answer), the link's lock and a ``wait_for``: with one record per request that was
    # most of the SDK's ~60 us a record. The sender instead writes the frames of one pass here
    # itself when the connection is open and nothing is queued before them, and settles their
    # answers from a future's callback.

    def writer_now(self) -> DataConnection | None:
        """The connection a request can be written on now without awaiting anything (see
        ``DataLink.connection_now``; also not when the socket is backlogged); None: use
        :meth:`send`."""
        connection = self._link.connection_now()
        if connection is None or connection.backlogged():
            return None
        return connection

    @staticmethod
    def write_request(
        connection: DataConnection,
        topic: str,
        acks: int,
        timeout_ms: int,
        partitions: list[tuple[int, bytes | bytearray]],
        trace_context: str = "",
        answer: AnswerSlot | None = None,
    ) -> None:
        """Queue one produce request on ``connection`` (written at ``connection.flush()`` or at
        the end of this loop iteration); its answer goes to ``answer`` (none at acks=0)."""
        correlation_id = connection.next_correlation_id()
        frame = dp.encode_produce_request(
            dp.ProduceRequest(correlation_id, acks, timeout_ms, topic, partitions, trace_context)  # type: ignore[arg-type]
        )
        connection.send_nowait(frame, None if acks == Acks.NONE else correlation_id, answer)

    @staticmethod
    def answer_late(connection: DataConnection, timeout_s: float) -> None:
        """A request on ``connection`` was not answered within ``timeout_s``: the connection is
        presumed stuck; it and every request waiting on it fail, the next opens a new one."""
        connection.break_(
            RequestTimedOutError(f"no produce answer from {connection.address} within {timeout_s:.1f}s")
        )

    def read_answer(self, connection: DataConnection, topic: str, body: bytes) -> ProduceAnswer:
        """The produce answer in ``body`` (its throttle time noted); NetworkError, breaking the
        connection, when it cannot be read."""
        try:
            answer = dp.decode_produce_response(body, connection.version)
        except errors.TributaryError as exc:
            connection.break_(NetworkError(f"bad produce answer from {connection.address}: {exc}"))
            raise NetworkError(f"bad produce answer from {connection.address}: {exc}") from exc
        self._link.observe(connection, answer.throttle_time_ms)
        return ProduceAnswer(topic, answer)

    async def close(self, timeout_s: float = 30.0) -> None:
        await self._link.close(timeout_s)
        await self._fallback.close(timeout_s)


# ---- fetch -----------------------------------------------------------------------------------


class StartedFetch(NamedTuple):
    """A fetch request written on a connection, its answer awaited by :meth:`RawFetcher.fetch`."""

    connection: DataConnection
    #: The fetch session it was framed in (None: sessionless).
    session: FetchSessionState | None
    #: The request as the caller gave it (every partition it wants).
    request: dp.FetchRequest
    correlation_id: int
    answer: asyncio.Future


class RawFetcher:
    """Fetch requests as frames on the data listener; None from :meth:`fetch` means "use gRPC".

    On a version-3 connection the fetches run in a fetch session (KIP-227, see
    :mod:`gateway.client.fetch_session`): the request names only what changed since the last
    answer, and the answer carries only the partitions with something to say. The caller still
    passes every partition it wants each time; a partition absent from the answer had nothing
    new. Session errors are retried here at once with a full fetch.

    :meth:`start` writes a request at once, without awaiting anything, when the connection is
    open and free: the consumer's fetcher sends its next fetch that way in the same loop turn
    as it buffers an answer, before ``poll`` decodes the records (as Kafka's consumer does), so
    the round trip overlaps the application's work."""

    def __init__(self, client: GatewayClient, *, sessions: bool = True) -> None:
        self._link = DataLink(client, throttles=client.fetch_throttles)
        #: Use fetch sessions when the gateway speaks version 3.
        self._sessions = sessions
        self._session = FetchSessionState()
        #: The connection the session lives on (a new connection starts a new session).
        self._session_connection: DataConnection | None = None
        #: Fetches sent so far, full and incremental (sessions only).
        self.full_fetches = 0
        self.incremental_fetches = 0

    async def open(self, topic: str) -> None:
        """Open the data connection now (if the gateway offers one), ahead of the first fetch."""
        await self._link.connection(topic)

    def start(self, request: dp.FetchRequest) -> StartedFetch | None:
        """Write ``request`` now when the connection is open and nothing waits before it (see
        ``DataLink.connection_now``); its answer is awaited with ``fetch(..., started=...)``.
        None: nothing was written (take :meth:`fetch`)."""
        connection = self._link.connection_now()
        if connection is None or connection.backlogged():
            return None
        started = self._write(connection, request)
        connection.flush()  # now, not at the end of this loop turn: the poll's decoding comes first
        return started

    def abandon(self, started: StartedFetch) -> None:
        """Drop a started fetch's answer (the consumer moved on: a seek, a close)."""
        started.connection.pending.pop(started.correlation_id, None)
        if started.session is not None:
            started.session.reset()  # its answer may be unread: the gateway's picture is unknown
        answer = started.answer
        if not answer.done():
            answer.cancel()
        elif not answer.cancelled():
            answer.exception()  # marked read: nobody awaits it now

    async def fetch(
        self, request: dp.FetchRequest, timeout_s: float, started: StartedFetch | None = None
    ) -> dp.FetchResponse | None:
        """The answer to ``request`` (written now, or already by :meth:`start`: ``started``)."""
        if started is None:
            topic = request.partitions[0].topic if request.partitions else ""
            connection = await self._link.connection(topic)
            if connection is None:
                return None
            started = self._write(connection, request)
            await connection.drain_if_backlogged()
        answer = await self._answer(started, timeout_s)
        if started.session is not None and answer.error_code in _SESSION_ERRORS:
            log.debug("fetch session %d refused (%s); full fetch", started.session.session_id, answer.error())
            started = self._write(started.connection, request)
            await started.connection.drain_if_backlogged()
            answer = await self._answer(started, timeout_s)
        return answer

    def _write(self, connection: DataConnection, request: dp.FetchRequest) -> StartedFetch:
        """Queue ``request`` on ``connection`` (in the connection's fetch session, if any)."""
        session: FetchSessionState | None = None
        framed = request
        if self._sessions and connection.version >= dp.SESSION_VERSION:
            if connection is not self._session_connection:
                self._session = FetchSessionState()
                self._session_connection = connection
            session = self._session
            if session.full:
                self.full_fetches += 1
            else:
                self.incremental_fetches += 1
            framed = session.request(request)
        correlation_id = connection.next_correlation_id()
        try:
            future = connection.send_nowait(
                dp.encode_fetch_request(
                    framed._replace(correlation_id=correlation_id, trace_context=current_traceparent()),
                    connection.version,
                ),
                correlation_id,
            )
        except BaseException:
            if session is not None:
                session.reset()
            raise
        assert isinstance(future, asyncio.Future)
        return StartedFetch(connection, session, request, correlation_id, future)

    async def _answer(self, started: StartedFetch, timeout_s: float) -> dp.FetchResponse:
        """Await and read ``started``'s answer (noting it in its session)."""
        connection, session = started.connection, started.session
        # A timer, not ``wait_for(shield(...))``: that took two more loop turns (and a future,
        # a task and a timer of its own) between the answer's arrival and its reading.
        late = asyncio.get_running_loop().call_later(timeout_s, _answer_late, connection, timeout_s)
        try:
            try:
                body = await started.answer
            except asyncio.CancelledError:
                # The consumer moved on (a seek): the answer, when it comes, is dropped.
                connection.pending.pop(started.correlation_id, None)
                raise
            finally:
                late.cancel()
            try:
                answer = dp.decode_fetch_response(body, connection.version)
            except errors.TributaryError as exc:
                connection.break_(NetworkError(f"bad fetch answer from {connection.address}: {exc}"))
                raise NetworkError(f"bad fetch answer from {connection.address}: {exc}") from exc
        except BaseException:
            if session is not None:
                session.reset()  # the answer was not read: the gateway's picture is unknown
            raise
        self._link.observe(connection, answer.throttle_time_ms)
        if session is not None:
            session.answered(answer)
        return answer

    async def close(self, timeout_s: float = 5.0) -> None:
        await self._link.close(timeout_s)


def _answer_late(connection: DataConnection, timeout_s: float) -> None:
    """A fetch on ``connection`` was not answered within ``timeout_s``: the connection is
    presumed stuck; it and every request waiting on it fail, the next opens a new one."""
    connection.break_(
        RequestTimedOutError(f"no fetch answer from {connection.address} within {timeout_s:.1f}s")
    )


#: Request-level errors after which a full fetch is sent at once.
_SESSION_ERRORS = (
    errors.FetchSessionIdNotFoundError.kafka_code,
    errors.InvalidFetchSessionEpochError.kafka_code,
)
