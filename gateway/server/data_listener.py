"""The raw data listener: produce and fetch over length-prefixed frames (``services/dataport``).

The same handlers as the gRPC servicer serve it -- :class:`ProduceHandler` with per-connection
:class:`AppendQueues` (each partition's appends in the order the requests arrived, as
ProduceStream), :class:`FetchHandler` on its raw path (the storage node's batch bytes are
relayed as they came, never decoded or re-encoded) -- so the two APIs cannot drift apart in
what they do; only the framing differs.

One connection, one :class:`_Connection`:

* the handshake comes first (the client offers versions, the gateway picks one or answers
  UNSUPPORTED_VERSION and closes);
* then frames are read one after another. A produce request is planned at once, in arrival
  order, and queued on the connection's append queues; a fetch runs as its own task. Answers go
  back as they are ready, each with its correlation id; acks=0 produce requests get none.
* Every frame one read brought is served in the same turn of the event loop, a produce with
  plain calls when it can be (a client without quotas, telemetry off, a topic whose route is
  known: ``ProduceHandler.plan_now``, answered from ``AppendQueues.submit_then``'s callback), so
  a one-record request costs no coroutine, task or future of its own, the appends of all of
  them go out in one round and the answers settled together in one write. Otherwise (quotas to
  meter, spans to make, a topic to look up) the request takes the full path, awaited before the
  next frame is read, so arrival order holds either way.
* Back-pressure, so a connection's memory stays bounded: the reader stops reading while the
  requests it has taken in and not answered hold ``max_in_flight_bytes`` (a fetch counts its
  ``max_bytes``, which is lowered to that budget) or ``max_in_flight_requests``, while the
  append queues are full, or while the client does not read its answers (the socket's write
  buffer is over its high-water mark; a client that reads none of them for ``stall_timeout_s``
  is disconnected, so answers nobody reads cannot pile up).
* Bad input never reaches a handler: a size prefix outside the limits, a frame that does not
  decode, an unknown kind or version is answered with an error frame (Kafka's code and an
  explanation) and the connection is closed. A client that stops in the middle of a frame
  (or of the handshake) for ``stall_timeout_s`` is disconnected, one that sends nothing and is
  owed nothing for ``max_idle_s`` too (Kafka's connections.max.idle.ms). Beyond
  ``max_connections`` new connections get an error frame and are closed. No other client
  notices any of this.
* Fetch sessions (protocol version 3, :mod:`gateway.server.fetch_sessions`): a consumer's
  partitions and positions are kept per connection, so its fetches name only what changed and
  their answers carry only partitions with something to say. A fetch is placed in its session
  as it is read (arrival order); a session error (unknown id, wrong epoch) is answered as a
  fetch error, never by closing the connection. Sessions are bounded per connection and end
  with it.
* Client quotas (:mod:`gateway.server.quotas`): a request that takes its client over a quota
  is served, its answer says for how long the client is held (``throttle_time_ms``, protocol
  version 2), and the connection reads no frame until then (Kafka's KIP-219 channel mute; an
  acks=0 produce, which gets no answer, holds it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Sequence
from time import perf_counter
from typing import NamedTuple, NoReturn

from gateway.server import answer_pass
from gateway.server.append_queue import AppendQueues
from gateway.server.authentication import Authenticator
from gateway.server.authorization import Gatekeeper
from gateway.server.batching import ProduceCommand
from gateway.server.fetch import (
    DEFAULT_PARTITION_MAX_BYTES,
    DEFAULT_TOTAL_MAX_BYTES,
    FetchCommand,
    FetchedPartition,
    FetchHandler,
    PartitionFetch,
)
from gateway.server.fetch_ahead import ReadAhead
from gateway.server.fetch_sessions import (
    DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_SESSIONS,
    FetchSessions,
    SessionCounts,
    SessionFetch,
    SessionPartition,
)
from gateway.server.loop_time import LoopTime, timed
from gateway.server.produce import ProduceHandler, ProduceOutcome, outcome_of
from gateway.server.quotas import ChannelThrottle, ClientQuota, ClientQuotas
from services import errors, tokens
from services.acks import Acks
from services.acls import ANONYMOUS
from services.append_result import AppendResult
from services.dataport import protocol as dp
from services.records import Compression
from services.tls import ReloadingSslContext

log = logging.getLogger(__name__)

#: How often the TLS certificate files are checked for a rotation.
TLS_RELOAD_CHECK_S = 5.0

#: Bytes of requests one connection may hold unanswered before it stops reading.
DEFAULT_MAX_IN_FLIGHT_BYTES = 64 << 20
#: Requests one connection may hold unanswered before it stops reading (as ProduceStream).
DEFAULT_MAX_IN_FLIGHT_REQUESTS = 1_000
DEFAULT_MAX_CONNECTIONS = 4_096
DEFAULT_STALL_TIMEOUT_S = 10.0
DEFAULT_MAX_IDLE_S = 600.0
#: Bytes asked of the socket per read (many small frames at a time).
_READ_SIZE = 1 << 16
#: Stop reading while this many answer bytes wait in the socket's buffer for the client.
_WRITE_HIGH_WATER = 4 << 20
#: A produce frame's acks (the decoder checked it is one of these).
_ACKS = {0: Acks.NONE, 1: Acks.LEADER, -1: Acks.ALL}


class DataListener:
    """The asyncio TCP server of the raw data protocol; ``start()``, then ``close()``."""

    def __init__(
        self,
        produce: ProduceHandler,
        fetch: FetchHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES,
        max_in_flight_requests: int = DEFAULT_MAX_IN_FLIGHT_REQUESTS,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        max_idle_s: float | None = DEFAULT_MAX_IDLE_S,
        max_frame: int = dp.MAX_REQUEST_FRAME,
        max_fetch_sessions: int = DEFAULT_MAX_SESSIONS,
        max_session_partitions: int = DEFAULT_MAX_PARTITIONS,
        telemetry=None,
        ssl_context: ReloadingSslContext | None = None,
        gatekeeper: Gatekeeper | None = None,
        authenticator: Authenticator | None = None,
        quotas: ClientQuotas | None = None,
    ) -> None:
        #: Authorization (None: off).
        self.gatekeeper = gatekeeper
        #: Who a connection is: its TLS certificate, or the token in its handshake.
        self.authenticator = authenticator or Authenticator()
        #: Client quotas (None: none enforced), per the connection's principal and client id.
        self.quotas = quotas
        self.produce = produce
        self.fetch = fetch
        self.host = host
        self._requested_port = port
        self.max_connections = max_connections
        self.max_in_flight_bytes = max_in_flight_bytes
        self.max_in_flight_requests = max_in_flight_requests
        self.stall_timeout_s = stall_timeout_s
        self.max_idle_s = max_idle_s
        self.max_frame = max_frame
        if max_fetch_sessions < 0 or max_session_partitions < 0:
            raise ValueError("fetch session bounds must not be negative")
        #: Fetch sessions per connection, and partitions per session (KIP-227, version 3).
        self.max_fetch_sessions = max_fetch_sessions
        self.max_session_partitions = max_session_partitions
        #: What every connection's sessions did (telemetry reads it; so can tests).
        self.session_counts = SessionCounts()
        #: GatewayInstruments when telemetry is on (a span per request), else None.
        self.telemetry = telemetry
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self.port = 0
        #: TLS (``services/tls.py``): every connection is TLS; None: plaintext.
        self._ssl = ssl_context
        self._reloader: asyncio.Task | None = None
        if telemetry is not None:
            telemetry.watch_fetch_sessions(self.session_counts, lambda: self.open_fetch_sessions)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def open_fetch_sessions(self) -> int:
        return sum(len(c.fetch_sessions) for c in list(self._connections) if c.fetch_sessions is not None)

    async def start(self) -> None:
        ssl_context = self._ssl.context if self._ssl is not None else None
        loop = asyncio.get_running_loop()

        def connection() -> _ListenerProtocol:  # asyncio.start_server's, with our protocol
            return _ListenerProtocol(asyncio.StreamReader(limit=1 << 16, loop=loop), self._accept, loop=loop)

        self._server = await loop.create_server(
            connection,
            self.host,
            self._requested_port,
            backlog=1024,
            ssl=ssl_context,
            ssl_handshake_timeout=self.stall_timeout_s if ssl_context is not None else None,
        )
        if self._ssl is not None:
            self._reloader = asyncio.create_task(self._reload_certificates(), name="data-listener-tls")
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("data listener on %s:%d", self.host, self.port)

    async def _reload_certificates(self) -> None:
        """New TLS handshakes use the certificate files as they are now (checked every few s)."""
        assert self._ssl is not None
        while True:
            await asyncio.sleep(TLS_RELOAD_CHECK_S)
            try:
                self._ssl.maybe_reload()
            except Exception:
                log.exception("reloading the data listener's TLS certificate failed")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.max_connections:
            log.warning("data listener refuses a connection: %d open", len(self._connections))
            writer.write(
                dp.encode_error(
                    dp.NO_CORRELATION_ID,
                    errors.NetworkError(f"the gateway has {self.max_connections} data connections open"),
                )
            )
            await _close(writer)
            return
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)

    async def close(self) -> None:
        """Stop accepting, end every connection (answers owed are lost to their clients, which
        fail those requests retriably)."""
        if self._reloader is not None:
            self._reloader.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)


async def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 1.0)


class _Closed(Exception):
    """The connection ends (the client went away, stalled, or sent what cannot be served)."""


class _ListenerProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, with a way around the stream for the usual request: bytes that
    arrive while the connection's reading loop waits for them with nothing buffered are offered
    to :meth:`_Connection.serve_now` first, which serves the produce frames it can at once, in
    this callback; only what it leaves goes to the stream (and wakes the reading loop). A
    one-at-a-time producer's request so costs no task wake-up, no read timeout armed and
    cancelled, and its append goes to the storage node in the turn of the loop that read it."""

    #: The connection served here once its handshake is done (None before and after).
    fast: _Connection | None = None

    def data_received(self, data: bytes) -> None:
        connection = self.fast
        if connection is not None and connection.parked:
            try:
                served = connection.serve_now(data)
            except Exception:  # a bug: the connection ends, as when the reading loop raises
                log.exception("data connection %s failed", connection.peer)
                connection.abort()
                return
            if served == len(data):
                return
            connection.parked = False  # the stream holds bytes now: the reading loop takes them
            if served:
                # the rest as a view: copied once, into the stream's buffer (bytearray.extend)
                super().data_received(memoryview(data)[served:])  # type: ignore[arg-type]
                return
        super().data_received(data)


class _Connection:
    """One client connection: handshake, then requests in, answers out."""

    def __init__(self, listener: DataListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.listener = listener
        self.reader = reader
        self.writer = writer
        #: Asked once (asking costs a system call per call in 3.11).
        self._loop = asyncio.get_running_loop()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        #: Set by the handshake (the certificate's, or the token's subject).
        self.principal = ANONYMOUS
        #: When the connection's token expires (seconds since the epoch); None: never.
        self.expires_at: float | None = None
        self.client_id = ""
        #: The protocol version agreed in the handshake.
        self.version = dp.MIN_VERSION
        #: Until when the connection is held for its client's quota (no frame is read).
        self.throttle = ChannelThrottle()
        self.queues: AppendQueues | None = None
        #: The connection's fetch sessions (version 3 connections only).
        self.fetch_sessions: FetchSessions | None = None
        self.tasks: set[asyncio.Task] = set()
        self.in_flight_bytes = 0
        self.in_flight_requests = 0
        #: The next fetch of the last answered fetch session, read ahead (fetch_ahead.py).
        self.read_ahead = ReadAhead()
        #: Answers finished in this loop iteration, written together at its end (``_write``).
        self._corked: list = []
        self._flush_scheduled = False
        #: Watches a write buffer over its high-water mark (``_watch_writes``), else None.
        self._write_watch: asyncio.Future | None = None
        #: Bytes read and not yet cut into frames (at most one frame plus one read).
        self._buffer = bytearray()
        self._room = asyncio.Event()
        self._room.set()
        self._serving: asyncio.Task | None = None
        #: True while the reading loop waits for bytes with none buffered (after the handshake):
        #: the protocol may then serve what arrives itself (:meth:`serve_now`).
        self.parked = False
        #: Loop time of the last frame :meth:`serve_now` served (the connection is not idle).
        self._served_at = 0.0

    # ---- the reading loop ------------------------------------------------------------------

    async def serve(self) -> None:
        self._serving = asyncio.current_task()
        protocol = self.writer.transport.get_protocol()
        try:
            await self._handshake()
            self.queues = self.listener.produce.stream_queues()
            if isinstance(protocol, _ListenerProtocol):
                protocol.fast = self
            await self._serve_requests(self.queues)
        except _Closed:
            pass
        except asyncio.CancelledError:
            pass
        except (ConnectionError, OSError) as exc:
            log.debug("data connection %s broke: %r", self.peer, exc)
        except Exception:
            log.exception("data connection %s failed", self.peer)
        finally:
            if isinstance(protocol, _ListenerProtocol):
                protocol.fast = None
            self.parked = False
            # Answers owed are lost with the connection (the client fails them retriably);
            # appends already queued still run, as after a closed ProduceStream.
            for task in self.tasks:
                task.cancel()
            if self.fetch_sessions is not None:
                self.fetch_sessions.close_all()  # a session dies with its connection
            if self._write_watch is not None:
                self._write_watch.cancel()
            self._flush()
            await _close(self.writer)  # flushes a last error frame, if any
            self.writer.transport.abort()

    async def _serve_requests(self, queues: AppendQueues) -> None:
        """Read and serve request frames until the client closes the connection.

        Every frame already read is served in the same turn of the loop, each with a plain call
        where it can be (see :meth:`_dispatch`): the appends of all of them join one round
        (``append_queue.py``), their answers one write (:meth:`_write`)."""
        max_frame = self.listener.max_frame
        throttle = self.throttle
        while True:
            if not self._room_to_read():
                await self._wait_for_room()
            if throttle.muted_until:
                await throttle.wait()
            body = self._cut_frame(max_frame)
            if body is None:
                body = await self._next_frame(max_frame, parkable=True)
                if body is None:
                    return
                if not (self._has_room() and queues.has_room):
                    # frames served as they arrived while this waited (serve_now) took the room
                    await self._wait_for_room()
            pending = self._dispatch(body)
            if pending is not None:
                await pending

    def abort(self) -> None:
        self.writer.transport.abort()
        if self._serving is not None:
            self._serving.cancel()

    async def _handshake(self) -> None:
        listener = self.listener
        body = await self._next_frame(dp.MAX_HANDSHAKE_FRAME, handshake=True)
        if body is None:
            raise _Closed
        try:
            handshake = dp.decode_handshake(body)
        except errors.TributaryError as exc:
            self._fail(dp.NO_CORRELATION_ID, exc)
        version = dp.choose_version(handshake)
        self.client_id = handshake.client_id
        if version is None:
            await self._refuse_handshake(
                errors.UnsupportedVersionError(
                    f"the client speaks versions {handshake.min_version}..{handshake.max_version}, "
                    f"this gateway {dp.MIN_VERSION}..{dp.MAX_VERSION}"
                )
            )
        self.version = version
        if version >= dp.SESSION_VERSION:
            self.fetch_sessions = FetchSessions(
                max_sessions=listener.max_fetch_sessions,
                max_partitions=listener.max_session_partitions,
                counts=listener.session_counts,
            )
        try:
            self.principal, self.expires_at = listener.authenticator.connection_principal(
                handshake.auth_token, self.writer.get_extra_info("peercert")
            )
        except errors.SaslAuthenticationFailedError as exc:
            log.info("data connection %s (%s) refused: %s", self.peer, self.client_id or "-", exc)
            await self._refuse_handshake(exc)
        self.writer.write(
            dp.encode_handshake_answer(
                dp.HandshakeAnswer(0, version, dp.MIN_VERSION, dp.MAX_VERSION, listener.max_frame)
            )
        )

    async def _refuse_handshake(self, refusal: errors.TributaryError) -> NoReturn:
        """Answer the handshake with ``refusal`` and end the connection (raises _Closed)."""
        listener = self.listener
        self.writer.write(
            dp.encode_handshake_answer(
                dp.HandshakeAnswer(
                    refusal.kafka_code,
                    -1,
                    dp.MIN_VERSION,
                    dp.MAX_VERSION,
                    listener.max_frame,
                    refusal.message,
                )
            )
        )
        await _close(self.writer)
        raise _Closed

    async def _next_frame(
        self, max_size: int, *, handshake: bool = False, parkable: bool = False
    ) -> bytes | None:
        """The next frame's body, or None at a clean end of the connection (between frames).

        Reads whatever the socket has (up to 64 KiB) into the connection's buffer and cuts
        frames from it, so a pipelining client costs one read per many frames rather than two
        per frame. A frame begun (or the handshake, which must come at once) has to arrive
        within ``stall_timeout_s``; between frames the connection may be quiet for
        ``max_idle_s`` (longer while answers are owed to it, or while :meth:`serve_now` serves
        what arrives). ``parkable``: with nothing buffered, the protocol may serve what arrives
        meanwhile (:meth:`serve_now`)."""
        buffer = self._buffer
        #: The idle deadline, when frames served by serve_now put it off.
        quiet_until: float | None = None
        while True:
            body = self._cut_frame(max_size, handshake=handshake)
            if body is not None:
                return body
            if parkable and not buffer and not self._room_to_read():
                await self._wait_for_room()  # the frames _take_in served took the room
            midframe = handshake or bool(buffer)
            timeout = self.listener.stall_timeout_s if midframe else self.listener.max_idle_s
            self.parked = parkable and not midframe
            try:
                if timeout is None:
                    chunk = await self.reader.read(_READ_SIZE)
                else:
                    deadline = quiet_until if quiet_until is not None else self._loop.time() + timeout
                    async with asyncio.timeout_at(deadline):  # a timer, not wait_for's task per read
                        chunk = await self.reader.read(_READ_SIZE)
            except TimeoutError:
                if not midframe:
                    if self.in_flight_requests:
                        quiet_until = None
                        continue  # quiet, but owed answers: not idle
                    assert timeout is not None
                    if self._served_at + timeout > self._loop.time():
                        quiet_until = self._served_at + timeout  # serve_now served frames meanwhile
                        continue
                what = "the handshake" if handshake else ("a frame" if midframe else "nothing (idle)")
                log.info("data connection %s stalled inside %s; closing it", self.peer, what)
                raise _Closed from None
            finally:
                self.parked = False
            quiet_until = None
            if not chunk:
                if buffer:
                    log.info("data connection %s ended inside a frame", self.peer)
                    raise _Closed
                return None
            if parkable:
                self._take_in(chunk, max_size)
            else:
                buffer += chunk

    def _take_in(self, chunk: bytes, max_size: int) -> None:
        """A read of the reading loop: the frames in it that :meth:`serve_now` serves are served
        at once, parsed in place (their records stay views into ``chunk``, immutable bytes);
        the rest goes to the buffer, for :meth:`_cut_frame`. A frame begun in the buffer is
        finished from ``chunk`` first (one copy, as the buffer's cut makes) and served the same
        way, so the usual pipelining client -- its frames across read boundaries -- costs no
        copy and no :meth:`_dispatch` per frame. What is not served is buffered as it came,
        in order, and the reading loop takes it as it would have."""
        buffer = self._buffer
        view = memoryview(chunk)
        if buffer:
            if len(buffer) < dp.SIZE.size:
                buffer += view
                return
            (size,) = dp.SIZE.unpack_from(buffer)
            need = dp.SIZE.size + size - len(buffer)
            if not dp.frame_size_ok(size, max_size) or need > len(view):
                buffer += view  # a bad size (the cut refuses it) or still not whole
                return
            frame = b"".join((buffer, view[:need]))
            if not self.serve_now(frame):
                buffer += view  # the reading loop serves it, and then what came after it
                return
            buffer.clear()
            view = view[need:]
        served = self.serve_now(view)
        if served < len(view):
            buffer += view[served:]

    def _cut_frame(self, max_size: int, *, handshake: bool = False) -> bytes | None:
        """The next frame's body if the buffer holds all of it, else None (a size prefix out of
        bounds ends the connection)."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (size,) = dp.SIZE.unpack_from(buffer)
        if handshake:
            if size < 1 or size > max_size:
                self._fail(dp.NO_CORRELATION_ID, errors.InvalidRequestError(f"handshake frame size {size}"))
        else:
            try:
                dp.check_frame_size(size, max_size)
            except errors.TributaryError as exc:
                self._fail(dp.NO_CORRELATION_ID, exc)
        end = 4 + size
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:  # one copy (a bytearray slice, then bytes, made two)
            body = bytes(view[4:end])
        del buffer[:end]  # O(1) at the front of a bytearray (the view is released)
        return body

    async def _wait_for_room(self) -> None:
        """Back-pressure: unanswered requests, full append queues, a client not reading."""
        while not self._has_room():
            self._room.clear()
            await self._room.wait()
        if self.queues is not None:
            await self.queues.wait_for_room()
        if self.writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER:
            await self.writer.drain()  # the write watch ends the connection if it never drains

    def _room_to_read(self) -> bool:
        """Whether the reading loop may take in more requests (else :meth:`_wait_for_room`)."""
        queues = self.queues
        return (
            self._has_room()
            and (queues is None or queues.has_room)
            and self.writer.transport.get_write_buffer_size() <= _WRITE_HIGH_WATER
        )

    def _has_room(self) -> bool:
        listener = self.listener
        return (
            self.in_flight_bytes < listener.max_in_flight_bytes
            and self.in_flight_requests < listener.max_in_flight_requests
        )

    def _fail(self, correlation_id: int, error: errors.TributaryError) -> NoReturn:
        """Answer an error frame and end the connection (bad input)."""
        log.info("data connection %s (%s): %s; closing it", self.peer, self.client_id or "-", error)
        with contextlib.suppress(Exception):
            self._flush()
            self.writer.write(dp.encode_error(correlation_id, error))
        raise _Closed

    # ---- requests ------------------------------------------------------------------------------

    def _dispatch(self, body: bytes) -> Awaitable[None] | None:
        """Serve one request frame: planned and queued (a produce) or started (a fetch) now, in
        arrival order; what must be awaited before the next frame is read, else None."""
        kind, correlation_id = dp.decode_header(body)
        if self.expires_at is not None and time.time() > self.expires_at + tokens.LEEWAY_S:
            # Kafka's KIP-368: a connection lives no longer than its credentials. As a Kafka
            # broker does, the connection is closed without serving the request: the client
            # sees a lost connection (retriable) and reconnects with a fresh token.
            log.info(
                "data connection %s (%s): its bearer token expired; closing it", self.peer, self.principal
            )
            raise _Closed
        quota = self._quota()
        spent = LoopTime() if quota is not None and quota.times_requests else None
        started = perf_counter() if quota is not None else 0.0
        if kind == dp.PRODUCE_REQUEST:
            try:
                request = dp.decode_produce_request(body)
            except errors.TributaryError as exc:
                self._fail(correlation_id, exc)
            if quota is None and self.listener.telemetry is None and self._produce_now(request, len(body)):
                return None
            metered = _metered(quota, spent, started)
            if quota is not None:
                # Counted as it is read, so a client pipelining requests is held from the next one.
                self.throttle.hold(quota.record_produce_bytes(len(body)))
            starting = self._start_produce(request, len(body), metered)
            return timed(starting, spent) if spent is not None else starting
        elif kind == dp.FETCH_REQUEST:
            try:
                fetch = dp.decode_fetch_request(body, self.version)
            except errors.TributaryError as exc:
                self._fail(correlation_id, exc)
            # The answer's record bytes count against the connection's budget while it is built.
            max_bytes = min(fetch.max_bytes or DEFAULT_TOTAL_MAX_BYTES, self.listener.max_in_flight_bytes)
            if quota is not None:
                max_bytes = quota.fetch_max_bytes(max_bytes)
            fetch = fetch._replace(max_bytes=max_bytes)
            metered = _metered(quota, spent, started)
            try:
                # Placed in its session now, in arrival order (epochs are checked in that order).
                planned = self._plan_fetch(fetch)
            except errors.TributaryError as exc:
                self._write(
                    dp.encode_fetch_response_parts(
                        dp.FetchResponse(
                            correlation_id,
                            exc.kafka_code,
                            exc.message,
                            [],
                            self._throttle_ms(metered),
                            fetch.session_id,
                        ),
                        self.version,
                    )
                )
                return None
            serving = self._serve_fetch(fetch, planned, metered)
            self._track(timed(serving, spent) if spent is not None else serving, len(body) + max_bytes)
            return None
        else:
            self._fail(correlation_id, errors.InvalidRequestError(f"unknown data frame kind {kind}"))

    def _quota(self) -> ClientQuota | None:
        """The quotas of this connection's client now (they may change while it is open)."""
        quotas = self.listener.quotas
        if quotas is None or not quotas.configured:
            return None
        return quotas.client(self.principal, self.client_id)

    def _throttle_ms(self, metered: _Metered | None, fetched_bytes: int = 0) -> int:
        """At a request's answer: count its loop time (and a fetch's bytes) on its client's
        quotas; how long from now the connection is held (the answer's throttle_time_ms)."""
        if metered is None:
            return 0
        quota = metered.quota
        if fetched_bytes:
            self.throttle.hold(quota.record_fetch_bytes(fetched_bytes))
        if metered.spent is not None:
            self.throttle.hold(quota.record_loop_time(metered.spent.seconds))
        return self.throttle.remaining_ms()

    def _track(self, work: Awaitable[None], size: int) -> None:
        self.in_flight_bytes += size
        self.in_flight_requests += 1
        task = asyncio.ensure_future(work)
        self.tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self.tasks.discard(task)
            self.in_flight_bytes -= size
            self.in_flight_requests -= 1
            if self._has_room():
                self._room.set()
            if not task.cancelled() and task.exception() is not None:
                log.error("data request failed on %s", self.peer, exc_info=task.exception())
                self.abort()

        task.add_done_callback(done)

    def serve_now(self, data: bytes | memoryview) -> int:
        """Serve the produce frames at the front of ``data`` -- bytes that arrived while the
        reading loop waited with nothing buffered (``parked``), or that it read
        (:meth:`_take_in`) -- now: how many bytes were served. Only what :meth:`_dispatch`
        would serve with plain calls (:meth:`_produce_now`), while the loop's conditions to read
        hold (room, no throttle); the reading loop takes the rest (a frame not whole, a fetch, a request that
        needs the full path, bad input) in order after these, as it would have. The appends of
        the frames served join one round, started before this returns."""
        listener = self.listener
        queues = self.queues
        if (
            queues is None
            or listener.telemetry is not None
            or self.expires_at is not None
            or self.throttle.muted_until
            or self._quota() is not None
        ):
            return 0
        transport = self.writer.transport
        max_frame = listener.max_frame
        frame_size_ok = dp.frame_size_ok
        # Frames are parsed in place: a produce's records stay views into ``data`` (immutable
        # bytes) all the way to the storage node's link, never copied here.
        view = memoryview(data)
        end = len(view)
        # A frame smaller than half the read it came in is copied out of it: its records, queued
        # for the storage node, would keep the whole read alive while the queues count only their
        # own bytes (a 100-byte record behind which a refused frame, or a frame's start copied to
        # the buffer, filled a 256 KiB read). A frame kept as a view is so at least half of what
        # it keeps alive: the byte budgets hold within 2x.
        keep_view_from = (len(view.obj) + 1) // 2  # type: ignore[arg-type]  # bytes (or a view's base)
        pos = 0
        queues.hold_rounds()
        try:
            while (
                end - pos >= 4
                and self._has_room()
                and queues.has_room
                and transport.get_write_buffer_size() <= _WRITE_HIGH_WATER
            ):
                (size,) = dp.SIZE.unpack_from(view, pos)
                frame_end = pos + 4 + size
                if not frame_size_ok(size, max_frame) or frame_end > end:
                    break  # a bad size: the reading loop's check_frame_size answers it
                body = view[pos + 4 : frame_end]
                if size < keep_view_from:
                    body = bytes(body)  # type: ignore[assignment]  # see keep_view_from
                if dp.decode_header(body)[0] != dp.PRODUCE_REQUEST:
                    break
                try:
                    request = dp.decode_produce_request(body)
                except errors.TributaryError:
                    break  # the reading loop answers it
                if not self._produce_now(request, size):
                    break
                pos = frame_end
        finally:
            queues.release_rounds()
        if pos:
            self._served_at = self._loop.time()
        return pos

    def _produce_now(self, request: dp.ProduceRequest, size: int) -> bool:
        """:meth:`_start_produce` without a coroutine or a task, for a client without quotas
        while telemetry is off: planned and queued now, answered (acks 1/all) from a callback
        when its appends are done. False (nothing done) when the request needs the full path
        (its topic's route is not known yet)."""
        produce = self.listener.produce
        acks = _ACKS[request.acks]
        # The records stay views into the frame (no copy): the frame's bytes are immutable.
        command = ProduceCommand(
            request.topic,
            (),
            request.partitions,
            acks,
            request.timeout_ms,
            Compression.NONE,
            request.correlation_id,
        )
        try:
            self._authorize("Produce", request)
            plan = produce.plan_now(command)
            if plan is None:
                return False
            queues = self.queues
            assert queues is not None, "set after the handshake"
            deadline = produce.deadline_for(command, None, now=self._loop.time())
        except errors.TributaryError as exc:
            if acks is not Acks.NONE:
                self._write([_produce_error(request.correlation_id, exc, 0, self.version)])
            else:
                log.info("acks=0 produce to %r from %s failed: %s", request.topic, self.peer, exc)
            return True
        if acks is Acks.NONE:  # queued, nobody to answer (no future either)
            produce.submit_then(plan, deadline=deadline, queues=queues, done=None)
            return True
        self.in_flight_bytes += size
        self.in_flight_requests += 1

        def appended(results: dict[int, AppendResult] | None) -> None:
            # Called as the appends settle: answers settled together leave in one write.
            self.in_flight_bytes -= size
            self.in_flight_requests -= 1
            if self._has_room():
                self._room.set()
            if results is None:  # the gateway is closing: the answer is lost, as a task's
                return
            outcome = outcome_of(plan, results)
            self._write([_produce_answer(outcome.correlation_id, outcome, 0, self.version)])

        produce.submit_then(plan, deadline=deadline, queues=queues, done=appended)
        return True

    async def _start_produce(self, request: dp.ProduceRequest, size: int, metered: _Metered | None) -> None:
        """Plan now (arrival order is append order), answer when appended."""
        produce = self.listener.produce
        command = ProduceCommand(
            topic=request.topic,
            batches=request.partitions,  # views into the frame, as in _produce_now
            acks=_ACKS[request.acks],
            timeout_ms=request.timeout_ms,
            correlation_id=request.correlation_id,
        )
        queues = self.queues
        assert queues is not None, "set after the handshake"
        span = self._start_span("produce", request.topic, request.trace_context)
        try:
            self._authorize("Produce", request)
            with self._current(span):  # its appends (and their RPCs) join the request's trace
                plan = await produce.plan(command)
                outcome = produce.enqueue(plan, deadline=produce.deadline_for(command, None), queues=queues)
        except errors.TributaryError as exc:
            self._end_span(span, exc)
            throttle_ms = self._throttle_ms(metered)
            if request.acks != 0:
                self._write([_produce_error(request.correlation_id, exc, throttle_ms, self.version)])
            else:
                log.info("acks=0 produce to %r from %s failed: %s", request.topic, self.peer, exc)
            return
        if request.acks == 0:
            # Queued, nobody to answer: the outcome (a coroutine, never to be awaited) is dropped.
            close = getattr(outcome, "close", None)
            if close is not None:
                close()
            self._end_span(span, None)
            self._throttle_ms(metered)  # no answer to say it: the connection is held all the same
            return
        answering = self._answer_produce(request.correlation_id, outcome, span, metered)
        spent = metered.spent if metered is not None else None
        self._track(timed(answering, spent) if spent is not None else answering, size)

    def _authorize(self, method: str, request) -> None:
        gate = self.listener.gatekeeper
        if gate is not None:
            gate.check(self.principal, self.host, method, request)

    async def _answer_produce(
        self, correlation_id: int, outcome: Awaitable[ProduceOutcome], span, metered: _Metered | None
    ) -> None:
        result = await outcome
        self._end_span(span, next((p.error for p in result.partitions if p.error is not None), None))
        throttle_ms = self._throttle_ms(metered)
        self._write([_produce_answer(correlation_id, result, throttle_ms, self.version)])

    def _plan_fetch(self, request: dp.FetchRequest) -> SessionFetch:
        """The partitions ``request`` fetches, in its session when it has one (raises the
        session's errors)."""
        sessions = self.fetch_sessions
        if sessions is None:  # version 1 or 2: no session fields at all
            return SessionFetch(
                None,
                True,
                tuple(
                    SessionPartition(
                        p.topic, p.partition, p.fetch_offset, p.max_bytes or DEFAULT_PARTITION_MAX_BYTES
                    )
                    for p in request.partitions
                ),
            )
        return sessions.begin(request, DEFAULT_PARTITION_MAX_BYTES)

    async def _serve_fetch(
        self, request: dp.FetchRequest, planned: SessionFetch, metered: _Metered | None
    ) -> None:
        command = FetchCommand(
            partitions=_partition_fetches(planned),
            min_bytes=request.min_bytes,
            max_wait_ms=request.max_wait_ms,
            max_bytes=request.max_bytes or DEFAULT_TOTAL_MAX_BYTES,
            raw_batches=True,
            read_committed=request.isolation_level == dp.READ_COMMITTED,
        )
        span = self._start_span(
            "fetch", command.partitions[0].topic if command.partitions else "", request.trace_context
        )
        sessions = self.fetch_sessions
        ahead = self.read_ahead
        results: Sequence[FetchedPartition | None]
        try:
            # Every partition the fetch reads, the session's included (ACLs may have changed).
            self._authorize("Fetch", command)
            with self._current(span):
                fetch = self.listener.fetch
                if planned.full:
                    ahead.cancel()
                    results = await fetch.fetch(command)
                else:
                    # an incremental fetch gets None for the partitions with nothing new; it may
                    # have been read ahead (fetch_ahead.py)
                    results = await ahead.fetch_news(fetch, planned.session, command)
        except errors.TributaryError as exc:
            if sessions is not None:
                sessions.fail(planned)
            self._end_span(span, exc)
            throttle_ms = self._throttle_ms(metered)
            self._write(
                dp.encode_fetch_response_parts(
                    dp.FetchResponse(
                        request.correlation_id,
                        exc.kafka_code,
                        exc.message,
                        [],
                        throttle_ms,
                        planned.session_id,
                    ),
                    self.version,
                )
            )
            return
        except BaseException:
            if sessions is not None:
                sessions.fail(planned)
            raise
        answered: list[FetchedPartition] = []
        if sessions is not None:
            for i in sessions.complete(planned, results):
                result = results[i]
                assert result is not None, "complete() answers only partitions with results"
                answered.append(result)
        else:
            answered = [r for r in results if r is not None]
        self._end_span(span, next((r.error for r in answered if r.error is not None), None))
        throttle_ms = self._throttle_ms(metered, sum(len(r.raw) for r in answered))
        self._write(
            dp.encode_fetch_response_parts(
                dp.FetchResponse(
                    request.correlation_id,
                    0,
                    "",
                    [_fetched(r) for r in answered],
                    throttle_ms,
                    planned.session_id,
                ),
                self.version,
            )
        )
        session = planned.session
        if (
            session is not None
            and not session.closed
            and metered is None
            and span is None
            and ReadAhead.wanted(command)
        ):
            # The session's next fetch, read now (fetch_ahead.py): what it would ask for if the
            # client moves nothing.
            following = SessionFetch(session, False, tuple(session.partitions.values()))
            ahead.start(
                self.listener.fetch,
                session,
                dataclasses.replace(command, partitions=_partition_fetches(following)),
                self.tasks,
            )

    def _write(self, parts: list) -> None:
        """Queue an answer for the write at the end of this loop iteration: answers finished
        together leave in one syscall (a fetch's record bytes are passed along, not copied)."""
        self._corked.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if not answer_pass.defer(self._flush):  # at the end of the node answers' pass, else
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        parts, self._corked = self._corked, []
        transport = self.writer.transport
        if parts and not transport.is_closing():
            self.writer.writelines(parts)
            if transport.get_write_buffer_size() > _WRITE_HIGH_WATER and self._write_watch is None:
                self._write_watch = asyncio.ensure_future(self._watch_writes())

    async def _watch_writes(self) -> None:
        """Answers are piling up unread: the client must read some within ``stall_timeout_s``,
        or it is disconnected (its answers would otherwise sit in this gateway's memory)."""
        transport = self.writer.transport
        try:
            await asyncio.wait_for(self.writer.drain(), self.listener.stall_timeout_s)
        except TimeoutError:
            log.warning(
                "data connection %s (%s) does not read its answers (%d bytes waiting for %.1f s); closing it",
                self.peer,
                self.client_id or "-",
                transport.get_write_buffer_size(),
                self.listener.stall_timeout_s,
            )
            self.abort()
        except (ConnectionError, RuntimeError):
            pass  # the connection is gone anyway
        finally:
            self._write_watch = None

    def _start_span(self, operation: str, topic: str, trace_context: str):
        telemetry = self.listener.telemetry
        if telemetry is None:
            return None
        return telemetry.start_data_request(operation, topic, self.client_id, trace_context)

    def _current(self, request):
        """The request's span as the current one (its children join it); nothing when off."""
        if request is None:
            return contextlib.nullcontext()
        return self.listener.telemetry.use_span(request)

    def _end_span(self, span, error) -> None:
        if span is not None:
            self.listener.telemetry.end_data_request(span, error)


def _partition_fetches(planned: SessionFetch) -> tuple[PartitionFetch, ...]:
    """What a fetch reads. An incremental fetch passes on what the client knows: the storage
    nodes then leave the quiet partitions out of their answers (fetch port version 3). (A tuple
    per partition of a session per fetch: built without NamedTuple's keyword handling.)"""
    new = tuple.__new__
    if planned.full:
        return tuple(
            new(PartitionFetch, (p.topic, p.partition, p.offset, p.max_bytes, -1, -1))
            for p in planned.partitions
        )
    # Each partition's tuple is kept on it while its fields hold (``SessionPartition.fetch``):
    # the same tuples fetch after fetch, which also makes a read ahead's command compare equal
    # to the next fetch's by identity (``fetch_ahead.py``).
    fetches: list[PartitionFetch] = []
    append = fetches.append
    for p in planned.partitions:
        fetch = p.fetch
        if fetch is None:
            fetch = p.fetch = new(
                PartitionFetch,
                (p.topic, p.partition, p.offset, p.max_bytes, p.high_watermark, p.log_start_offset),
            )
        append(fetch)
    return tuple(fetches)


class _Metered(NamedTuple):
    """A request of a client with quotas: its quotas, and its loop time when that is metered."""

    quota: ClientQuota
    spent: LoopTime | None


def _metered(quota: ClientQuota | None, spent: LoopTime | None, started: float) -> _Metered | None:
    """What a request's client quotas need at its answer (None: no quota applies)."""
    if quota is None:
        return None
    if spent is not None:
        spent.add_since(started)  # decoding the frame
    return _Metered(quota, spent)


def _produce_error(
    correlation_id: int, error: errors.TributaryError, throttle_ms: int, version: int
) -> bytes:
    return dp.encode_produce_response(
        dp.ProduceResponse(correlation_id, error.kafka_code, error.message, [], throttle_ms), version
    )


def _produce_answer(correlation_id: int, outcome: ProduceOutcome, throttle_ms: int, version: int) -> bytes:
    return dp.encode_produce_response(
        dp.ProduceResponse(
            correlation_id,
            0,
            "",
            [
                dp.PartitionProduceResult(
                    r.partition,
                    dp.error_code_of(r.error),
                    r.base_offset,
                    r.log_append_time,
                    r.log_start_offset,
                    r.record_count,
                    r.error.message if r.error is not None else "",
                )
                for r in outcome.partitions
            ],
            throttle_ms,
        ),
        version,
    )


def _fetched(result: FetchedPartition) -> dp.FetchPartitionResult:
    error = result.error
    return dp.FetchPartitionResult(
        result.topic,
        result.partition,
        dp.error_code_of(error),
        result.high_watermark,
        result.log_start_offset,
        result.next_offset,
        result.last_stable_offset,
        result.aborted,
        error.message if error is not None else "",
        result.raw,
    )
