"""The fetch port: a plain TCP listener serving record batches with ``os.sendfile``.

This is the zero-copy read path of the paper: the records go from the segment file's page cache
to the socket without entering the process. Each connection is one asyncio task handling one
request at a time, in order (as Kafka does per connection); clients open several connections for
parallel fetches. The framing is in :mod:`storage_node.fetch.protocol`.

A bad frame (wrong size, garbage, truncated) gets an INVALID_REQUEST answer when it can be
framed and the connection is closed; a client that stalls mid-frame is dropped after
``frame_timeout`` seconds, an idle one after ``idle_timeout``. None of this touches other
connections or the stored data.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from services import errors
from services.fetchport import protocol
from storage_node.notifier import AppendNotifier

log = logging.getLogger(__name__)


SEND_BUFFER_BYTES = 4 * 1024 * 1024


@dataclass
class FetchStats:
    """Counters exported as metrics: bytes served through sendfile and through read+send."""

    requests: int = 0
    sendfile_bytes: int = 0
    copied_bytes: int = 0
    errors: int = 0
    connections: int = 0


class _PeerClosed(Exception):
    pass


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise _PeerClosed()
        got += n
    return bytes(buf)


async def _wait_writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    future = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, lambda: future.done() or future.set_result(None))
    try:
        await future
    finally:
        loop.remove_writer(fd)


async def sendfile_range(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, file_fd: int, position: int, length: int
) -> None:
    """Send ``length`` bytes of ``file_fd`` from ``position`` with ``os.sendfile``.

    Fails loudly (OSError) if the file ends before ``length`` bytes: a segment must never shrink
    under a reader, and a short send would corrupt the framing.
    """
    sent_total = 0
    out_fd = sock.fileno()
    while sent_total < length:
        try:
            sent = os.sendfile(out_fd, file_fd, position + sent_total, length - sent_total)
        except BlockingIOError:
            await _wait_writable(loop, sock)
            continue
        if sent == 0:
            raise OSError(
                errno.EIO, f"segment file ended {length - sent_total} bytes early while serving a fetch"
            )
        sent_total += sent


async def _send_header(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, header: bytes, *, more: bool
) -> None:
    """Send a response header; with ``more``, corked (MSG_MORE) so it leaves in the same TCP
    segment as the records that follow instead of as its own packet and wake-up (measured: a
    separate ~40-byte send cost ~200 us of loopback stack time per fetch)."""
    if more:
        try:
            sent = sock.send(header, socket.MSG_MORE)
        except BlockingIOError:
            sent = 0
        header = header[sent:]
    if header:
        await loop.sock_sendall(sock, header)


async def copy_range(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, file_fd: int, position: int, length: int
) -> None:
    """The non-zero-copy comparison path: pread into the process, then send (benchmarks only)."""
    chunk = 1 << 20
    done = 0
    while done < length:
        data = os.pread(file_fd, min(chunk, length - done), position + done)
        if not data:
            raise OSError(errno.EIO, "segment file ended early while serving a fetch")
        await loop.sock_sendall(sock, data)
        done += len(data)


class FetchServer:
    """Serves fetch requests for the partitions ``get_log`` knows.

    ``get_log(topic, partition)`` returns a partition log with ``read(offset, max_bytes)`` giving
    a FetchInfo (``slice``, ``log_start_offset``, ``log_end_offset``, ``high_watermark``), or raises
    UnknownTopicOrPartitionError.
    """

    def __init__(
        self,
        get_log: Callable[[str, int], object],
        notifier: AppendNotifier,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        zero_copy: bool = True,
        idle_timeout: float = 600.0,
        frame_timeout: float = 30.0,
        telemetry=None,
    ) -> None:
        self._get_log = get_log
        self._notifier = notifier
        self._host = host
        self._port = port
        self._zero_copy = zero_copy
        self._idle_timeout = idle_timeout
        self._frame_timeout = frame_timeout
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()
        self.stats = FetchStats()
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
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("fetch port accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A send buffer that holds a whole default-sized fetch lets one sendfile call hand
            # it all to the kernel instead of waking up per 200 KiB of buffer space.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            task = asyncio.create_task(self._connection_routine(sock))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _connection_routine(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.stats.connections += 1
        try:
            while True:
                size_bytes = await asyncio.wait_for(_recv_exactly(loop, sock, 4), self._idle_timeout)
                (size,) = protocol.SIZE.unpack(size_bytes)
                try:
                    protocol.check_request_size(size)
                except errors.TributaryError as exc:
                    await self._answer_error(loop, sock, -1, exc)
                    return
                body = await asyncio.wait_for(_recv_exactly(loop, sock, size), self._frame_timeout)
                try:
                    request = protocol.decode_request_body(body)
                except errors.TributaryError as exc:
                    await self._answer_error(loop, sock, -1, exc)
                    return
                await self._serve(loop, sock, request)
        except (_PeerClosed, TimeoutError, ConnectionError):
            pass
        except OSError as exc:
            log.warning("fetch connection dropped: %s", exc)
        finally:
            self.stats.connections -= 1
            sock.close()

    async def _answer_error(self, loop, sock, correlation_id: int, error: errors.TributaryError) -> None:
        self.stats.errors += 1
        await loop.sock_sendall(sock, protocol.encode_response_header(correlation_id, error=error))

    async def _serve(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, request: protocol.FetchRequest
    ):
        self.stats.requests += 1
        deadline = loop.time() + request.max_wait_ms / 1000.0
        key = (request.topic, request.partition)
        while True:
            try:
                partition_log = self._get_log(request.topic, request.partition)
                info = partition_log.read(request.offset, request.max_bytes)
            except errors.TributaryError as exc:
                await self._answer_error(loop, sock, request.correlation_id, exc)
                return
            available = info.slice.length if info.slice is not None else 0
            remaining = deadline - loop.time()
            if available >= max(request.min_bytes, 1) or remaining <= 0:
                break
            await self._notifier.wait(key, remaining)
        sent = await self._send_slice(loop, sock, request.correlation_id, info)
        if self._telemetry is not None:
            self._telemetry.fetched(request.topic, sent)

    async def _send_slice(self, loop, sock, correlation_id: int, info) -> int:
        """Send the header and the slice's bytes; returns the record bytes sent."""
        file_slice = info.slice
        length = file_slice.length if file_slice is not None else 0
        fd = None
        if length:
            try:
                # Our own descriptor: the log may close or delete the segment's handle meanwhile,
                # and an open fd keeps the inode's bytes readable until we are done.
                fd = os.open(file_slice.path, os.O_RDONLY)
            except FileNotFoundError:
                length = 0  # deleted by retention between read and open: answer empty, client retries
        header = protocol.encode_response_header(
            correlation_id,
            high_watermark=info.high_watermark,
            log_start_offset=info.log_start_offset,
            log_end_offset=info.log_end_offset,
            records_length=length,
        )
        try:
            await _send_header(loop, sock, header, more=bool(length))
            if length:
                send = sendfile_range if self._zero_copy else copy_range
                await send(loop, sock, fd, file_slice.position, length)
                if self._zero_copy:
                    self.stats.sendfile_bytes += length
                else:
                    self.stats.copied_bytes += length
        finally:
            if fd is not None:
                os.close(fd)
        return length
