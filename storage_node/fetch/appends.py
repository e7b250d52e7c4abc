"""Appends on the data port: one connection's pipelined append requests (framing in
:mod:`services.fetchport.append`).

The fetch server hands a connection here when its first frame is an append (version 2); from
then on the connection carries appends only. Many requests may be in flight on it: each is read
whole into one buffer, decoded (the record bytes stay views into that buffer), and handed to the
same append path as the gRPC ``StorageNode.Append`` (``StorageNodeHandlers.append``: leader and
leader-epoch checks, validation, the write, acks=all's wait for the in-sync replicas, telemetry).
Each answer goes back with its correlation id as soon as it is done, so an acks=all request
waiting for the followers holds up no other request.

Order: appends of one partition on one connection are written in the order their requests were
received. The append path writes synchronously once it starts, except for a transactional batch
that first asks the transaction coordinator; so each partition append waits (only) until the
previous append of the same partition on this connection has been written or has failed.

Bounds, so that no client can make the node grow without limit or stall other clients:

* a frame larger than ``max_frame_bytes`` (the node's message bound, as for gRPC) is refused
  before its body is read: the connection is read no further, the requests already in flight are
  answered, then a connection-level error (correlation id -1), and the connection is closed; so
  is a frame that does not parse, or has an unknown version. Nothing of it is written;
* a frame's buffer grows as its bytes arrive (at most twice what arrived, plus 64 KiB), so a
  client that announces a large frame and stalls holds little memory, and is dropped after
  ``frame_timeout`` seconds; an idle connection after ``idle_timeout``;
* at most ``max_in_flight_bytes`` of requests and ``max_in_flight_requests`` requests are in
  flight per connection, and at most ``max_unsent_bytes`` of answers wait for a slow reader:
  past these the connection is not read until they drain (TCP back-pressure).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE
from services.grpc_server import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

#: Deadline of an acks=all append whose request sets none (as the gRPC servicer's).
DEFAULT_TIMEOUT_MS = 30_000
#: A frame body up to this size is allocated at once; beyond, its buffer grows as bytes arrive.
_EAGER_BYTES = 64 << 10


class Appender(Protocol):
    """The append path (``StorageNodeHandlers.append``)."""

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes,
        *,
        acks: Acks,
        timeout_s: float,
        leader_epoch: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> AppendResult: ...


@dataclass(frozen=True, slots=True)
class AppendLimits:
    """What one append connection may hold (see the module docstring)."""

    max_frame_bytes: int = MAX_MESSAGE_BYTES
    max_in_flight_bytes: int = 64 << 20
    max_in_flight_requests: int = 1024
    max_unsent_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if min(self.max_frame_bytes, self.max_in_flight_bytes, self.max_in_flight_requests) < 1:
            raise ValueError(f"append limits out of range: {self}")


class PeerClosed(Exception):
    """The client closed the connection (or reset it)."""


class AppendConnection:
    """Serves one connection's append requests until the client closes it or misbehaves."""

    def __init__(
        self,
        sock: socket.socket,
        appender: Appender,
        *,
        limits: AppendLimits,
        frame_timeout: float,
        idle_timeout: float,
        stats,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._appender = appender
        self._limits = limits
        self._frame_timeout = frame_timeout
        self._idle_timeout = idle_timeout
        #: The fetch server's FetchStats (``appends``, ``append_errors``).
        self._stats = stats
        self._tasks: set[asyncio.Task] = set()
        self._in_flight_bytes = 0
        #: (topic, partition) -> a future done once the latest append of it on this connection
        #: was written (or failed): the next one of the partition waits for it.
        self._tails: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._unsent: list[bytes] = []
        self._unsent_bytes = 0
        self._sender: asyncio.Task | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._broken = False
        #: The connection-level error to answer once in-flight requests are answered.
        self._refusal: bytes | None = None

    # ---- reading ---------------------------------------------------------------------------------

    async def serve(self, size: int, version_bytes: bytes) -> None:
        """Serve the connection, whose first frame's size and version were read already."""
        try:
            while True:
                if not await self._take_frame(size, version_bytes):
                    break
                size, version_bytes = await self._next_frame_start()
            await self._finish()
        except (PeerClosed, TimeoutError, ConnectionError):
            await self._finish()
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._sender is not None:
                self._sender.cancel()

    async def _next_frame_start(self) -> tuple[int, bytes]:
        async with asyncio.timeout(self._idle_timeout):
            head = await self._recv_exactly(SIZE.size)
        (size,) = SIZE.unpack(head)
        if size < 2:
            return size, b""
        async with asyncio.timeout(self._frame_timeout):
            return size, await self._recv_exactly(2)

    async def _take_frame(self, size: int, version_bytes: bytes) -> bool:
        """Read, decode and start one request; False when the connection must close."""
        limits = self._limits
        if not frames.REQUEST_FIXED_SIZE <= size <= limits.max_frame_bytes:
            return self._refuse(
                errors.InvalidRequestError(
                    f"append frame size {size} outside {frames.REQUEST_FIXED_SIZE}.."
                    f"{limits.max_frame_bytes} (the node's message bound)"
                )
            )
        version = frames.request_version(version_bytes)
        if version != frames.APPEND_VERSION:
            return self._refuse(
                errors.UnsupportedVersionError(
                    f"version {version} on an append connection (appends are version "
                    f"{frames.APPEND_VERSION}; fetches go on their own connections)"
                )
            )
        while not self._room.is_set():
            await self._room.wait()
        async with asyncio.timeout(self._frame_timeout):
            body = await self._recv_body(size, version_bytes)
        try:
            request = frames.decode_request_body(body)
        except errors.TributaryError as exc:
            return self._refuse(exc)
        self._start(request, size)
        return True

    async def _recv_exactly(self, size: int) -> bytes:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = await self._loop.sock_recv_into(self._sock, view[got:])
            if n == 0:
                raise PeerClosed()
            got += n
        return bytes(buf)

    async def _recv_body(self, size: int, version_bytes: bytes) -> bytearray:
        """The whole body (``version_bytes`` then the rest) in one buffer, received in place."""
        buf = bytearray(min(size, _EAGER_BYTES))
        buf[:2] = version_bytes
        got = 2
        while got < size:
            if got == len(buf):  # grow as bytes arrive: a stalled sender holds little
                buf.extend(bytes(min(size, 2 * len(buf)) - len(buf)))
            with memoryview(buf) as view:
                n = await self._loop.sock_recv_into(self._sock, view[got:])
            if n == 0:
                raise PeerClosed()
            got += n
        return buf

    def _refuse(self, error: errors.TributaryError) -> bool:
        """Stop reading: the connection-level error goes out once the requests already in
        flight are answered (so the client need not doubt them), then the connection closes."""
        self._stats.append_errors += 1
        log.info("append connection refused a frame: %s", error)
        self._refusal = frames.encode_error_response(frames.CONNECTION_ERROR_ID, error)
        return False

    # ---- serving ---------------------------------------------------------------------------------

    def _start(self, request: frames.AppendRequest, size: int) -> None:
        """Start a request now (in arrival order), keeping each partition's place in line."""
        self._stats.appends += 1
        waits = []
        for p in request.partitions:
            key = (p.topic, p.partition)
            previous = self._tails.get(key)
            mine: asyncio.Future[None] = self._loop.create_future()
            self._tails[key] = mine
            waits.append((previous, mine))
        self._in_flight_bytes += size
        task = self._loop.create_task(self._serve_request(request, waits, size))
        self._tasks.add(task)
        task.add_done_callback(self._request_done)
        self._update_room()

    def _request_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._update_room()

    async def _serve_request(self, request: frames.AppendRequest, waits, size: int) -> None:
        try:
            appends = [
                self._append_in_order(request, p, previous, mine)
                for p, (previous, mine) in zip(request.partitions, waits, strict=True)
            ]
            results = [await appends[0]] if len(appends) == 1 else list(await asyncio.gather(*appends))
            answer = frames.encode_response(request.correlation_id, results)
        except Exception as exc:  # a bug: answer it rather than leave the client waiting
            log.exception("append request %d failed", request.correlation_id)
            answer = frames.encode_error_response(
                request.correlation_id, errors.UnknownServerError(repr(exc))
            )
        finally:
            self._in_flight_bytes -= size
        self._send(answer)

    async def _append_in_order(
        self,
        request: frames.AppendRequest,
        p: frames.PartitionAppend,
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> AppendResult:
        key = (p.topic, p.partition)

        def written() -> None:
            if not mine.done():
                mine.set_result(None)

        try:
            if previous is not None and not previous.done():
                await previous
            return await self._appender.append(
                p.topic,
                p.partition,
                p.records,  # type: ignore[arg-type]  # a view into the frame: the log takes any buffer
                acks=request.acks,
                timeout_s=(request.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
                leader_epoch=None if p.leader_epoch == frames.NO_EPOCH else p.leader_epoch,
                written=written,
            )
        finally:
            written()
            if self._tails.get(key) is mine:
                del self._tails[key]

    # ---- writing ---------------------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        """Send an answer now if the socket takes it, else queue it for the sender task."""
        if self._broken:
            return
        if not self._unsent:
            try:
                sent = self._sock.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._broken = True
                return
            if sent == len(frame):
                return
            frame = frame[sent:]
        self._unsent.append(frame)
        self._unsent_bytes += len(frame)
        if self._sender is None or self._sender.done():
            self._sender = self._loop.create_task(self._send_routine())

    async def _send_routine(self) -> None:
        try:
            while self._unsent:
                data = b"".join(self._unsent)
                self._unsent.clear()
                self._unsent_bytes = 0
                self._update_room()
                await self._loop.sock_sendall(self._sock, data)
        except OSError:
            self._broken = True
            self._unsent.clear()
            self._unsent_bytes = 0

    def _update_room(self) -> None:
        limits = self._limits
        if (
            self._in_flight_bytes < limits.max_in_flight_bytes
            and len(self._tasks) < limits.max_in_flight_requests
            and self._unsent_bytes < limits.max_unsent_bytes
        ):
            self._room.set()
        else:
            self._room.clear()

    async def _finish(self) -> None:
        """No more requests: let those in flight answer, then the refusal if any, then flush."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._refusal is not None:
            self._send(self._refusal)
        if self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)
