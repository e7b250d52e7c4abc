"""The fetch port: a plain TCP listener serving record batches with ``os.sendfile``.

This is the zero-copy read path of the paper: the records go from the segment file's page cache
to the socket without entering the process. Each connection is one asyncio task handling one
request at a time, in order (as Kafka does per connection); clients open several connections for
parallel fetches. The framing is in :mod:`services.fetchport.protocol` (version 0, one partition,
consumers) and :mod:`services.fetchport.multi` (version 1, many partitions, followers and
consumers). The same port takes appends (version 2, :mod:`services.fetchport.append`): a
connection that sends one is handed to :mod:`storage_node.fetch.appends` and carries pipelined
appends from then on (the gateway keeps one such connection per node); the connection caps below
count it like any other.

What a fetch may see is the replica manager's rule (``storage_node/replication``): consumers read
from the leader only, below the high watermark; followers read to the log end, and their fetch
offsets are how the leader learns their positions (the high watermark, the ISR).

A bad frame (wrong size, garbage, truncated) gets an INVALID_REQUEST answer when it can be
framed and the connection is closed; a client that stalls mid-frame is dropped after
``frame_timeout`` seconds, an idle one after ``idle_timeout``. None of this touches other
connections or the stored data.

Bounds (:class:`FetchLimits`), the same for every connection whatever it asks for:

* connections: at most ``max_connections`` open (sized so the log keeps its descriptors, see
  ``storage_node/descriptors.py``) and ``max_connections_per_ip`` per client address, as Kafka's
  ``max.connections`` and ``max.connections.per.ip``. A connection over either cap is accepted,
  answered with one THROTTLING_QUOTA_EXCEEDED error frame (correlation id -1) saying which cap,
  closed, and counted in ``FetchStats.connections_refused``.
* long polls: ``max_wait_ms`` is capped at ``max_wait_ms`` (default 30 s, ``fetch.max.wait.ms``).
  A request asking for more is served, not refused: the wait is an upper bound and answering
  earlier with what there is (maybe nothing) is always within the contract -- consumers poll
  again, as they do after any empty answer -- so existing clients keep working, while a
  2^31-1 ms request no longer parks a connection for 24 days. Counted in ``waits_capped``.
* a long poll whose client disconnects ends at once (the socket is watched for EOF while it
  waits; ``polls_cancelled``), instead of holding its descriptor until the wait runs out.

TLS (``tls``, a :class:`~services.tls.ReloadingSslContext`; the storage node's internal TLS):
every connection starts with a TLS handshake, within ``frame_timeout``; with mutual TLS a client
without a certificate from the cluster CA fails it and is closed before a byte of it is read as a
request (``tls_handshake_failures``). Connections run through a
:class:`~storage_node.fetch.links.TlsLink`: no sendfile, the records are read and encrypted in
the process. Rotated certificate files are picked up at the next accept (checked at most every
:data:`TLS_RELOAD_CHECK_S`). A connection over a cap is closed without the error frame (it could
only be sent in plaintext).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services import errors
from services.fetchport import append as append_frames
from services.fetchport import multi, protocol
from services.log_limit import RepeatedLog
from services.tls import ReloadingSslContext
from storage_node.fetch.appends import AppendConnection, Appender, AppendLimits, PeerClosed
from storage_node.fetch.links import PlainLink, TlsLink
from storage_node.log.file_records import FileSlice
from storage_node.notifier import AppendNotifier

log = logging.getLogger(__name__)


SEND_BUFFER_BYTES = 4 * 1024 * 1024
#: Under TLS, how often (at most) an accept checks the certificate files for a rotation.
TLS_RELOAD_CHECK_S = 1.0


#: Kafka's fetch.max.wait.ms bound: a long poll answers within this, whatever it asked for.
DEFAULT_MAX_WAIT_MS = 30_000
#: Default cap per client address: room for 16 gateways on one host at their default 64
#: connections per node, far below what a node's descriptor budget allows.
DEFAULT_MAX_CONNECTIONS_PER_IP = 1024


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """What one storage node lets fetch-port clients hold (see the module docstring)."""

    #: Most connections open at once (all clients together).
    max_connections: int = 1024
    #: Most connections from one client address; 0 = no per-address bound.
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP
    #: Longest a long poll waits, whatever ``max_wait_ms`` the request asked for.
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_ip < 0 or self.max_wait_ms < 0:
            raise ValueError(f"fetch limits out of range: {self}")


@dataclass
class FetchStats:
    """Counters exported as metrics: bytes served through sendfile and through read+send, and
    what the :class:`FetchLimits` turned away."""

    requests: int = 0
    sendfile_bytes: int = 0
    copied_bytes: int = 0
    errors: int = 0
    connections: int = 0
    #: Connections closed at accept because a connection cap was reached.
    connections_refused: int = 0
    #: Long polls ended because their client disconnected while they waited.
    polls_cancelled: int = 0
    #: Requests whose ``max_wait_ms`` was above the cap.
    waits_capped: int = 0
    #: Append requests served (``storage_node/fetch/appends.py``), and frames refused on them.
    appends: int = 0
    append_errors: int = 0
    #: Connections carrying appends, open now (counted in ``connections`` too).
    append_connections: int = 0
    #: TLS handshakes completed, and failed (a client without a valid certificate, not TLS, gone).
    tls_handshakes: int = 0
    tls_handshake_failures: int = 0


def slice_descriptor(file_slice: FileSlice) -> int:
    """A descriptor of our own for the file the slice was taken from, to send it with.

    A duplicate of the slice's descriptor, never the file opened again by its path: the cleaner
    renames a cleaned segment to the name of the one it replaces, and retention or the cleaner
    unlink segments, so by the time the answer goes out the path may name another file or none.
    The duplicate keeps the slice's inode (its bytes, even once unlinked) until we close it, and
    is ours to close whatever the log does with its own handle meanwhile."""
    return os.dup(file_slice.fileno())


class _PeerClosed(Exception):
    pass


def _complete(future: asyncio.Future[None], *_ignored: object) -> None:
    """Complete ``future`` unless it is done (a timer callback, or a done callback)."""
    if not future.done():
        future.set_result(None)


class _Connection:
    """One accepted client: its link (plaintext or TLS) and the address its per-address count is
    kept under."""

    __slots__ = ("host", "link")

    def __init__(self, link: PlainLink | TlsLink, host: str) -> None:
        self.link = link
        self.host = host


async def _recv_exactly(link: PlainLink | TlsLink, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = await link.recv_into(view[got:])
        if n == 0:
            raise _PeerClosed()
        got += n
    return bytes(buf)


class FetchReader(Protocol):
    """What the fetch port reads through (the replica manager)."""

    def read_for_consumer(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        committed: bool = False,
        bounds_only: bool = False,
    ) -> Any:
        """A FetchInfo (``slice``, ``log_start_offset``, ``log_end_offset``, ``high_watermark``)
        below the high watermark (the last stable offset when ``committed``) of a partition this
        node leads, or a TributaryError; ``bounds_only``: without records."""

    def committed_view(self, topic: str, partition: int, offset: int) -> tuple[int, list[tuple[int, int]]]:
        """The last stable offset and the aborted transactions from ``offset`` (read_committed)."""

    def read_for_follower(self, replica_id: int, fetch: multi.PartitionFetch) -> tuple[Any, Any]:
        """``(FetchInfo, None)`` up to the log end, or ``(None, EpochEndOffset)`` on divergence."""

    def get(self, topic: str, partition: int) -> Any:
        """The replica (its ``log`` has the offsets an error answer reports, and the offsets a
        sparse fetch checks; ``ensure_leader(None)`` raises unless this node leads it)."""


class FetchServer:
    """Serves fetch requests through ``reader`` (see :class:`FetchReader`)."""

    def __init__(
        self,
        reader: FetchReader,
        notifier: AppendNotifier,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        zero_copy: bool = True,
        idle_timeout: float = 600.0,
        frame_timeout: float = 30.0,
        limits: FetchLimits | None = None,
        telemetry=None,
        appender: Appender | None = None,
        append_limits: AppendLimits | None = None,
        tls: ReloadingSslContext | None = None,
    ) -> None:
        self._reader = reader
        #: TLS on every connection (see the module docstring); None: plaintext.
        self._tls = tls
        self._tls_checked_at = 0.0
        self._handshake_log = RepeatedLog(log)
        #: The append path for connections that carry appends; None = fetches only.
        self._appender = appender
        self.append_limits = append_limits or AppendLimits()
        self._notifier = notifier
        self._host = host
        self._port = port
        self._zero_copy = zero_copy
        self._idle_timeout = idle_timeout
        self._frame_timeout = frame_timeout
        self.limits = limits or FetchLimits()
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()
        self._connections_per_host: Counter[str] = Counter()
        self.stats = FetchStats()
        self._refusals_log = RepeatedLog(log)
        #: StorageNodeInstruments when telemetry is on (bytes out per topic), else None.
        self._telemetry = telemetry

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return self._listener.getsockname()[1]

    async def start(self) -> int:
        """Bind and start accepting; returns the bound port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._port))
        listener.listen(1024)
        listener.setblocking(False)
        self._listener = listener
        self._accept_task = asyncio.create_task(self._accept_routine(), name="fetch-accept")
        return self.port

    async def stop(self) -> None:
        if self._accept_task:
            self._accept_task.cancel()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._listener:
            self._listener.close()

    async def _accept_routine(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                sock, address = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                self._refusals_log.warning("fetch port accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            host = address[0]
            refusal = self._refusal(host)
            if refusal is not None:
                self._refuse(sock, host, refusal)
                continue
            link = self._link(loop, sock)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A send buffer that holds a whole default-sized fetch lets one sendfile call hand
            # it all to the kernel instead of waking up per 200 KiB of buffer space.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            self.stats.connections += 1
            self._connections_per_host[host] += 1
            task = asyncio.create_task(self._connection_routine(_Connection(link, host)))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def _link(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> PlainLink | TlsLink:
        """The new connection's link: TLS with the certificate files as they are now, or plain."""
        if self._tls is None:
            return PlainLink(loop, sock, zero_copy=self._zero_copy)
        now = loop.time()
        if now - self._tls_checked_at >= TLS_RELOAD_CHECK_S:
            self._tls_checked_at = now
            try:
                self._tls.maybe_reload()
            except Exception:
                log.exception("reloading the fetch port's TLS certificate failed")
        return TlsLink(loop, sock, self._tls.context)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from ``host`` must be refused, or None."""
        limits = self.limits
        if self.stats.connections >= limits.max_connections:
            return (
                f"the fetch port has {self.stats.connections} connections open, its limit "
                f"(fetch.max.connections={limits.max_connections})"
            )
        per_ip = limits.max_connections_per_ip
        if per_ip and self._connections_per_host[host] >= per_ip:
            return (
                f"{self._connections_per_host[host]} fetch-port connections are open from {host}, "
                f"the limit per address (fetch.max.connections.per.ip={per_ip})"
            )
        return None

    def _refuse(self, sock: socket.socket, host: str, reason: str) -> None:
        """Answer one error frame, if the socket takes it without waiting, and close."""
        self.stats.connections_refused += 1
        self._refusals_log.warning("fetch port refused a connection from %s: %s", host, reason)
        error = errors.ThrottlingQuotaExceededError(
            f"connection refused: {reason}; close idle connections or retry later"
        )
        if self._tls is None:  # under TLS the frame could only go in plaintext: just close
            try:
                sock.send(protocol.encode_response_header(-1, error=error))
            except OSError:
                pass  # the peer is gone already, or its buffer is full: the close says enough
        sock.close()

    async def _handshake(self, conn: _Connection) -> bool:
        """The TLS handshake (nothing in plaintext); False when the client is refused or left."""
        if not conn.link.tls:
            return True
        try:
            async with asyncio.timeout(self._frame_timeout):
                await conn.link.handshake()
        except (ssl.SSLError, TimeoutError, ConnectionError) as exc:
            self.stats.tls_handshake_failures += 1
            self._handshake_log.warning("fetch port: TLS handshake with %s failed: %s", conn.host, exc)
            return False
        self.stats.tls_handshakes += 1
        return True

    async def _connection_routine(self, conn: _Connection) -> None:
        try:
            if await self._handshake(conn):
                await self._serve_requests(conn)
        except (_PeerClosed, PeerClosed, TimeoutError, ConnectionError):
            pass
        except OSError as exc:
            log.warning("fetch connection dropped: %s", exc)
        finally:
            self.stats.connections -= 1
            self._connections_per_host[conn.host] -= 1
            if not self._connections_per_host[conn.host]:
                del self._connections_per_host[conn.host]
            conn.link.close()

    async def _serve_requests(self, conn: _Connection) -> None:
        """Requests one after another until the client leaves or misbehaves (or sends an append:
        the connection is the append path's from then on)."""
        loop = asyncio.get_running_loop()
        link = conn.link
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the
            # cancellation of a stopping node (when the read completes at that moment), and
            # the connection then held up the node's shutdown until its idle timeout.
            async with asyncio.timeout(self._idle_timeout):
                size_bytes = await _recv_exactly(link, 4)
            (size,) = protocol.SIZE.unpack(size_bytes)
            version_bytes = b""
            if 2 <= size <= max(multi.MAX_MULTI_REQUEST_FRAME, self.append_limits.max_frame_bytes):
                async with asyncio.timeout(self._frame_timeout):
                    version_bytes = await _recv_exactly(link, 2)
                if append_frames.request_version(version_bytes) == append_frames.APPEND_VERSION:
                    await self._serve_appends(conn, size, version_bytes)
                    return
            if not 2 <= size <= multi.MAX_MULTI_REQUEST_FRAME:
                await self._answer_error(
                    link,
                    -1,
                    errors.InvalidRequestError(
                        f"fetch request frame size {size} outside 2..{multi.MAX_MULTI_REQUEST_FRAME}"
                    ),
                )
                return
            async with asyncio.timeout(self._frame_timeout):
                rest = await _recv_exactly(link, size - 2)
            body = version_bytes + rest
            version = append_frames.request_version(body)
            many = version in (multi.MULTI_FETCH_VERSION, multi.SPARSE_FETCH_VERSION)
            try:
                if many:
                    multi_request = multi.decode_request_body(body)
                else:
                    protocol.check_request_size(size)
                    request = protocol.decode_request_body(body)
            except errors.TributaryError as exc:
                if many:
                    await link.sendall(multi.encode_error_response(-1, exc))
                else:
                    await self._answer_error(link, -1, exc)
                return
            if many:
                await self._serve_multi(loop, conn, multi_request)
            else:
                await self._serve(loop, conn, request)

    async def _serve_appends(self, conn: _Connection, size: int, version_bytes: bytes) -> None:
        """The connection carries appends from this frame on (``storage_node/fetch/appends.py``)."""
        if self._appender is None:
            await self._answer_error(
                conn.link, -1, errors.UnsupportedVersionError("this port serves fetches only (no appends)")
            )
            return
        self.stats.append_connections += 1
        try:
            await AppendConnection(
                conn.link,
                self._appender,
                limits=self.append_limits,
                frame_timeout=self._frame_timeout,
                idle_timeout=self._idle_timeout,
                stats=self.stats,
                telemetry=self._telemetry,
            ).serve(size, version_bytes)
        finally:
            self.stats.append_connections -= 1

    async def _answer_error(
        self, link: PlainLink | TlsLink, correlation_id: int, error: errors.TributaryError
    ) -> None:
        self.stats.errors += 1
        await link.sendall(protocol.encode_response_header(correlation_id, error=error))

    def _poll_deadline(self, loop: asyncio.AbstractEventLoop, max_wait_ms: int) -> float:
        """When a long poll asking for ``max_wait_ms`` must answer: capped by the limits."""
        if max_wait_ms > self.limits.max_wait_ms:
            self.stats.waits_capped += 1
            max_wait_ms = self.limits.max_wait_ms
        return loop.time() + max_wait_ms / 1000.0

    async def _wait_for_appends(self, conn: _Connection, keys: Sequence[object], timeout: float) -> None:
        """Wait until one of the partitions ``keys`` gets an append or ``timeout`` s pass.

        Raises _PeerClosed when the client disconnects meanwhile, so the poll ends at once.
        """
        # One future, completed by an append, the client's close or the timeout, awaited as it
        # is: an append wakes the poll in one loop turn (``asyncio.wait`` took two: its own
        # callback, then the task), before the appender's next work.
        woken = self._notifier.watch(keys)
        wake = functools.partial(_complete, woken)
        closed = conn.link.watch_for_close()
        closed.add_done_callback(wake)
        timer = asyncio.get_running_loop().call_later(timeout, wake)
        try:
            await woken
        finally:
            timer.cancel()
            closed.remove_done_callback(wake)
            conn.link.stop_watching()
            self._notifier.unwatch(keys, woken)
        if closed.done():
            self.stats.polls_cancelled += 1
            raise _PeerClosed()

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, conn: _Connection, request: protocol.FetchRequest
    ):
        self.stats.requests += 1
        link = conn.link
        deadline = self._poll_deadline(loop, request.max_wait_ms)
        key = (request.topic, request.partition)
        while True:
            try:
                info = self._reader.read_for_consumer(
                    request.topic, request.partition, request.offset, request.max_bytes
                )
            except errors.TributaryError as exc:
                await self._answer_error(link, request.correlation_id, exc)
                return
            available = info.slice.length if info.slice is not None else 0
            remaining = deadline - loop.time()
            if available >= max(request.min_bytes, 1) or remaining <= 0:
                break
            await self._wait_for_appends(conn, (key,), remaining)
        sent = await self._send_slice(link, request.correlation_id, info)
        if self._telemetry is not None:
            self._telemetry.fetched(request.topic, sent)

    async def _send_slice(self, link: PlainLink | TlsLink, correlation_id: int, info) -> int:
        """Send the header and the slice's bytes; returns the record bytes sent."""
        file_slice = info.slice
        length = file_slice.length if file_slice is not None else 0
        fd = slice_descriptor(file_slice) if length else None
        header = protocol.encode_response_header(
            correlation_id,
            high_watermark=info.high_watermark,
            log_start_offset=info.log_start_offset,
            log_end_offset=info.log_end_offset,
            records_length=length,
        )
        try:
            await link.send_header(header, more=bool(length))
            if length and fd is not None:  # fd is open whenever length is not 0
                await link.send_file(fd, file_slice.position, length)
                self._count_sent(link, length)
        finally:
            if fd is not None:
                os.close(fd)
        return length

    def _count_sent(self, link: PlainLink | TlsLink, length: int) -> None:
        if link.zero_copy:
            self.stats.sendfile_bytes += length
        else:
            self.stats.copied_bytes += length

    # ---- version 1: many partitions, followers and consumers -------------------------------------

    async def _serve_multi(
        self, loop: asyncio.AbstractEventLoop, conn: _Connection, request: multi.MultiFetchRequest
    ):
        """Read every partition of the request, long-polling until ``min_bytes`` are available
        (or an error or a divergence is to be reported, or ``max_wait_ms`` passed), then send each
        partition's header and records (sendfile) in request order -- for a sparse (version 3)
        request only those with something new (``multi.is_quiet``)."""
        self.stats.requests += 1
        deadline = self._poll_deadline(loop, request.max_wait_ms)
        while True:
            parts = self._read_partitions(request)
            read = [part for part in parts if part is not None]  # (a sparse fetch's quiet ones are None)
            available = sum(part[1] for part in read)
            urgent = any(part[0].error_code or part[0].diverging_epoch >= 0 for part in read)
            remaining = deadline - loop.time()
            if urgent or available >= max(request.min_bytes, 1) or remaining <= 0:
                break
            keys = [(p.topic, p.partition) for p in request.partitions]
            await self._wait_for_appends(conn, keys, remaining)
        if request.sparse:
            committed = request.isolation_level == multi.READ_COMMITTED
            parts = [
                part
                for fetch, part in zip(request.partitions, parts, strict=True)
                if part is not None and not multi.is_quiet(fetch, part[0], part[1], committed)
            ]
        await self._send_multi(conn.link, request.correlation_id, parts)

    def _read_partitions(
        self, request: multi.MultiFetchRequest
    ) -> list[tuple[multi.PartitionHeader, int, Any] | None]:
        """``(header without records_length, record length, FetchInfo or None)`` per partition,
        within the response's byte budget (the first batch of the response goes whole); None
        for a partition of a sparse request known to be quiet (see below)."""
        budget = request.max_bytes
        parts: list[tuple[multi.PartitionHeader, int, Any] | None] = []
        append = parts.append
        committed = request.isolation_level == multi.READ_COMMITTED
        sparse = request.sparse
        get = self._reader.get
        for fetch in request.partitions:
            # (unpacked as the tuple it is: faster than its named fields, for every partition)
            topic, number, offset, _, _, _, known_hw, known_start = fetch
            if sparse and known_hw >= 0:
                # Known quiet: nothing to read -- at its high watermark (last stable offset), or
                # anywhere in its log once the answer's byte budget is spent -- and the offsets
                # its fetcher knows: nothing to say, found without a read (most partitions of a
                # wide fetch session; inline, as it runs for each of them). Anything else -- an
                # error included -- is read the usual way.
                try:
                    replica = get(topic, number)
                    replica.ensure_leader(None)
                except errors.TributaryError:
                    pass
                else:
                    log = replica.log
                    bound = log.last_stable_offset if committed else log.high_watermark
                    start = log.log_start_offset
                    if (
                        bound == known_hw
                        and start == known_start
                        and (offset == bound or (budget <= 0 and start <= offset < bound))
                    ):
                        append(None)
                        continue
            header, info = self._read_partition(request, fetch, max(budget, 0))
            length = info.slice.length if info is not None and info.slice is not None else 0
            budget -= length
            append((header, length, info))
        return parts

    def _read_partition(self, request: multi.MultiFetchRequest, fetch: multi.PartitionFetch, budget: int):
        topic, partition = fetch.topic, fetch.partition
        max_bytes = min(fetch.partition_max_bytes, budget) if budget > 0 else 0
        try:
            if request.from_follower:
                info, diverging = self._reader.read_for_follower(request.replica_id, fetch)
                if diverging is not None:
                    replica_log = self._reader.get(topic, partition).log
                    return multi.PartitionHeader(
                        topic,
                        partition,
                        high_watermark=replica_log.high_watermark,
                        log_start_offset=replica_log.log_start_offset,
                        log_end_offset=replica_log.log_end_offset,
                        diverging_epoch=diverging.epoch,
                        diverging_end_offset=diverging.end_offset,
                    ), None
            else:
                committed = request.isolation_level == multi.READ_COMMITTED
                # Past the response's byte budget only the offsets are answered: no segment lookup
                # (with hundreds of partitions per request most are past it).
                info = self._reader.read_for_consumer(
                    topic,
                    partition,
                    fetch.fetch_offset,
                    fetch.partition_max_bytes,
                    committed=committed,
                    bounds_only=max_bytes <= 0,
                )
                if committed:
                    last_stable, aborted = self._reader.committed_view(topic, partition, fetch.fetch_offset)
        except errors.TributaryError as exc:
            return self._error_header(topic, partition, exc), None
        if max_bytes <= 0 and info.slice is not None:
            info = type(info)(None, info.log_start_offset, info.log_end_offset, info.high_watermark)
        header = multi.PartitionHeader(
            topic,
            partition,
            high_watermark=info.high_watermark,
            log_start_offset=info.log_start_offset,
            log_end_offset=info.log_end_offset,
        )
        if not request.from_follower and request.isolation_level == multi.READ_COMMITTED:
            header = header._replace(last_stable_offset=last_stable, aborted=tuple(aborted))
        return header, info

    def _error_header(
        self, topic: str, partition: int, error: errors.TributaryError
    ) -> multi.PartitionHeader:
        """An error answer, with the partition's offsets when this node has its log (a follower
        out of range needs them to restart or truncate)."""
        self.stats.errors += 1
        bounds = (-1, -1, -1)
        try:
            replica_log = self._reader.get(topic, partition).log
            bounds = (replica_log.high_watermark, replica_log.log_start_offset, replica_log.log_end_offset)
        except errors.TributaryError:
            pass
        return multi.PartitionHeader(
            topic,
            partition,
            error_code=error.kafka_code,
            high_watermark=bounds[0],
            log_start_offset=bounds[1],
            log_end_offset=bounds[2],
            message=error.message,
        )

    async def _send_multi(self, link: PlainLink | TlsLink, correlation_id: int, parts) -> None:
        fds: list[int | None] = []
        headers: list[bytes] = []
        try:
            for header, length, info in parts:
                fd = slice_descriptor(info.slice) if length else None
                fds.append(fd)
                headers.append(multi.encode_partition_header(header, records_length=length))
            lengths = [length if fd is not None else 0 for (_, length, _), fd in zip(parts, fds)]
            body_length = sum(len(h) for h in headers) + sum(lengths)
            # Headers go out together up to the next records (one send, not one per partition:
            # most partitions of a wide fetch carry none).
            pending = [multi.encode_response_prefix(correlation_id, len(parts), body_length)]
            sent_total = 0
            for (header, _, info), head, length, fd in zip(parts, headers, lengths, fds):
                pending.append(head)
                if length and fd is not None:  # fd is open whenever length is not 0
                    await link.send_header(b"".join(pending), more=True)
                    pending = []
                    await link.send_file(fd, info.slice.position, length)
                    sent_total += length
                    if self._telemetry is not None:
                        self._telemetry.fetched(header.topic, length)
            if pending:
                await link.send_header(b"".join(pending), more=False)
            self._count_sent(link, sent_total)
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
