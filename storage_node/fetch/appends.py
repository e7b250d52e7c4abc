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
* a connection reads into one 64 KiB buffer: the frames that fit are parsed out of it (many small
  frames per system call, each body copied out once), a larger frame is received in place into
  its own buffer, which grows as its bytes arrive (at most twice what arrived), so a client that
  announces a large frame and stalls holds little memory, and is dropped after ``frame_timeout``
  seconds; an idle connection after ``idle_timeout``;
* at most ``max_in_flight_bytes`` of requests and ``max_in_flight_requests`` requests are in
  flight per connection, and at most ``max_unsent_bytes`` of answers wait for a slow reader:
  past these the connection is not read until they drain (TCP back-pressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE
from services.grpc_server import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from storage_node.fetch.links import PlainLink, Take, TlsLink

log = logging.getLogger(__name__)

_NO_SPAN = contextlib.nullcontext()
#: Deadline of an acks=all append whose request sets none (as the gRPC servicer's).
DEFAULT_TIMEOUT_MS = 30_000
#: Each connection's read buffer. Frames that fit are parsed out of it (one recv for many small
#: frames, the body copied out once); larger ones are received in place into their own buffer.
_READ_BUFFER_BYTES = 64 << 10
#: Requests a connection serves before it lets the event loop take a turn (when every one was
#: served at once, the socket never ran dry, and no bound stopped the reading).
_FRAMES_PER_TURN = 128


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
        link: PlainLink | TlsLink,
        appender: Appender,
        *,
        limits: AppendLimits,
        frame_timeout: float,
        idle_timeout: float,
        stats,
        telemetry=None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        #: The connection's byte stream (``links.py``): the socket, or TLS over it.
        self._link = link
        self._appender = appender
        #: ``appender.append_now`` when it has one (``StorageNodeHandlers.append_now``: the append
        #: without an event-loop turn, or None when it must wait); test doubles may not.
        self._append_now: Callable[..., AppendResult | None] | None = getattr(appender, "append_now", None)
        self._limits = limits
        self._frame_timeout = frame_timeout
        self._idle_timeout = idle_timeout
        #: The fetch server's FetchStats (``appends``, ``append_errors``).
        self._stats = stats
        #: StorageNodeInstruments when telemetry is on (a SERVER span per request), else None.
        self._telemetry = telemetry
        self._tasks: set[asyncio.Task] = set()
        self._in_flight_bytes = 0
        #: (topic, partition) -> the turn of the latest append of it on this connection, done
        #: once written (or failed): the next one of the partition waits for it.
        self._tails: dict[tuple[str, int], _Turn] = {}
        self._unsent: list[bytes] = []
        self._unsent_bytes = 0
        self._sender: asyncio.Task | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._broken = False
        #: The connection-level error to answer once in-flight requests are answered.
        self._refusal: bytes | None = None
        self._rbuf = bytearray(_READ_BUFFER_BYTES)
        self._rview = memoryview(self._rbuf)
        #: Unread bytes are ``_rbuf[_rstart:_rend]``.
        self._rstart = 0
        self._rend = 0
        self._flush_scheduled = False
        #: True while the read loop starts a request: an answer it sends is flushed before the
        #: loop next waits (:meth:`_flush_before_waiting`), not from a turn of the event loop.
        self._reading = False
        #: The idle deadline (loop time) :meth:`_take_now` last set, having served frames while
        #: the read loop waited for the next one.
        self._taken_until = 0.0

    # ---- reading ---------------------------------------------------------------------------------

    async def serve(self, size: int, version_bytes: bytes) -> None:
        """Serve the connection, whose first frame's size and version were read already."""
        head = SIZE.pack(size) + version_bytes  # put them back in front of the rest
        self._rbuf[: len(head)] = head
        self._rend = len(head)
        try:
            served = 0
            while await self._take_frame():
                served += 1
                if served == _FRAMES_PER_TURN:
                    # Frames served at once (no task) never fill the in-flight bound, and the
                    # socket may always have more: give the loop -- the answers' flush, other
                    # connections -- a turn now and then.
                    served = 0
                    self._flush_before_waiting()
                    await asyncio.sleep(0)
            await self._finish()
        except (PeerClosed, TimeoutError, ConnectionError):
            await self._finish()
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._sender is not None:
                self._sender.cancel()

    async def _take_frame(self) -> bool:
        """Read, decode and start one request; False when the connection must close."""
        await self._fill(SIZE.size, self._idle_timeout, at_frame_start=True)
        (size,) = SIZE.unpack_from(self._rbuf, self._rstart)
        if (refusal := self._size_refusal(size)) is not None:
            return self._refuse(refusal)
        await self._fill(SIZE.size + 2, self._frame_timeout)
        version = frames.request_version(self._rview[self._rstart + SIZE.size :])
        if (refusal := self._version_refusal(version)) is not None:
            return self._refuse(refusal)
        while not self._room.is_set():
            self._flush_before_waiting()
            await self._room.wait()
        body: bytes | bytearray
        if SIZE.size + size <= len(self._rbuf):
            await self._fill(SIZE.size + size, self._frame_timeout)
            start = self._rstart + SIZE.size
            body = bytes(self._rview[start : start + size])
            self._rstart = start + size
        else:
            body = await self._read_large(size)
        try:
            request = frames.decode_request_body(body)
        except errors.TributaryError as exc:
            return self._refuse(exc)
        self._reading = True  # answers wait for the read loop's next wait (_flush_before_waiting)
        try:
            self._start(request, size)
        finally:
            self._reading = False
        return True

    def _size_refusal(self, size: int) -> errors.TributaryError | None:
        """The error refusing a frame that announces ``size`` bytes, or None when it may be read
        (the one size check of both :meth:`_take_frame` and :meth:`_take_now`)."""
        if frames.REQUEST_FIXED_SIZE <= size <= self._limits.max_frame_bytes:
            return None
        return errors.InvalidRequestError(
            f"append frame size {size} outside {frames.REQUEST_FIXED_SIZE}.."
            f"{self._limits.max_frame_bytes} (the node's message bound)"
        )

    @staticmethod
    def _version_refusal(version: int) -> errors.TributaryError | None:
        """The error refusing a frame of ``version``, or None for an append (the one version
        check of both :meth:`_take_frame` and :meth:`_take_now`)."""
        if version == frames.APPEND_VERSION:
            return None
        return errors.UnsupportedVersionError(
            f"version {version} on an append connection (appends are version "
            f"{frames.APPEND_VERSION}; fetches go on their own connections)"
        )

    async def _fill(self, need: int, timeout: float, *, at_frame_start: bool = False) -> None:
        """Until the read buffer holds ``need`` unread bytes (at most its size); ``timeout`` s.
        ``at_frame_start``: a new frame is awaited, and with nothing buffered, the frames that
        arrive whole meanwhile may be served as they arrive (:meth:`_take_now`)."""
        if self._rend - self._rstart >= need:
            return
        deadline = self._loop.time() + timeout
        while self._rend - self._rstart < need:
            # (checked each time: _take_now may have left the unread bytes at the buffer's end)
            if self._rstart + need > len(self._rbuf):  # move the unread bytes to the front
                unread = bytes(self._rview[self._rstart : self._rend])
                self._rbuf[: len(unread)] = unread
                self._rstart, self._rend = 0, len(unread)
            take = self._take_now if at_frame_start and self._rstart == self._rend else None
            # (received first: _take_now may move the buffer's ends while this waits)
            got = await self._recv_into(self._rview[self._rend :], deadline, take)
            self._rend += got
            if take is not None and self._taken_until > deadline:
                deadline = self._taken_until

    async def _recv_into(self, view: memoryview, deadline: float, take: Take | None = None) -> int:
        """Receive into ``view``: at once when bytes are waiting, else by ``deadline`` (offered
        to ``take`` as they arrive: see ``PlainLink.recv_into_kept``)."""
        try:
            got = self._link.recv_into_nowait(view)
        except BlockingIOError:
            self._flush_before_waiting()
            got = await self._link.recv_into_kept(view, deadline, take)
        if got == 0:
            raise PeerClosed()
        return got

    def _take_now(self, got: int) -> tuple[memoryview, float] | None:
        """The read loop waits for a new frame with nothing buffered, and ``got`` bytes just came
        (at ``_rend``): serve the whole frames among them now, in the callback that received
        them, as :meth:`_take_frame` would (the same checks, then :meth:`_start`), and answer
        before returning. All served: the buffer is empty again and the wait goes on (the view
        and the idle deadline for it); else None, the unserved bytes left for the read loop (a
        frame not whole, bad input, no room), which resumes with them."""
        rview = self._rview
        pos = self._rend
        end = pos + got
        self._reading = True
        try:
            while end - pos >= SIZE.size + 2 and self._room.is_set():
                (size,) = SIZE.unpack_from(self._rbuf, pos)
                frame_end = pos + SIZE.size + size
                # (a refused frame is left to the read loop, which makes the same checks and
                # answers the refusal)
                if self._size_refusal(size) is not None or frame_end > end:
                    break
                if self._version_refusal(frames.request_version(rview[pos + SIZE.size :])) is not None:
                    break
                try:
                    request = frames.decode_request_body(bytes(rview[pos + SIZE.size : frame_end]))
                except errors.TributaryError:
                    break  # the read loop refuses it
                self._start(request, size)
                pos = frame_end
        finally:
            self._reading = False
        self._flush_before_waiting()
        if pos < end:
            self._rstart = pos  # the read loop resumes with _rend + got: the rest is unread
            return None
        self._rstart = self._rend = 0
        self._taken_until = self._loop.time() + self._idle_timeout
        return rview, self._taken_until

    async def _read_large(self, size: int) -> bytearray:
        """A frame larger than the read buffer, received in place into its own buffer, which
        grows as bytes arrive (a stalled sender holds little: a buffer made the frame's size,
        or even 1 MiB, at once let a thousand connections that announce large frames and stall
        hold a GiB; ``test_a_thousand_half_open_connections_do_not_stop_appends``) and is never
        larger than the frame (a receive would take the next frame's first bytes into it)."""
        deadline = self._loop.time() + self._frame_timeout
        start = self._rstart + SIZE.size
        buffered = self._rend - start
        buf = bytearray(min(size, max(buffered, _READ_BUFFER_BYTES)))
        buf[:buffered] = self._rview[start : self._rend]
        self._rstart = self._rend = 0
        got = buffered
        while got < size:
            if got == len(buf):
                buf.extend(bytes(min(size, 2 * len(buf)) - len(buf)))
            view = memoryview(buf)[got:]
            try:
                got += await self._recv_into(view, deadline)
            finally:
                view.release()
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
        if request.partitions:  # a probe is not an append
            self._stats.appends += 1
        waits = []
        tails = self._tails
        for p in request.partitions:
            key = (p.topic, p.partition)
            previous = tails.get(key)
            mine = tails[key] = _Turn()
            waits.append((previous, mine))
        deadline = self._loop.time() + (request.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000
        done: list[AppendResult] = []
        if request.acks is not Acks.ALL and self._telemetry is None and request.partitions:
            # Served here and now when every partition's turn has come (the usual case): no
            # task, and the answer leaves in this turn of the loop (see _append_ready).
            try:
                self._append_ready(request, waits, deadline, done)
                answer = (
                    frames.encode_response(request.correlation_id, done)
                    if len(done) == len(request.partitions)
                    else None
                )
            except Exception as exc:  # noqa: BLE001 -- a bug (logged): answered, not left waiting
                for p, (_previous, mine) in zip(request.partitions, waits, strict=True):
                    self._finish_turn(p, mine)  # nothing waits on this request any more
                answer = self._server_error(request, exc)
            if answer is not None:
                self._send(answer)
                self._update_room()  # the answers waiting to be sent count against the bound
                return
        self._in_flight_bytes += size
        task = self._loop.create_task(self._serve_request(request, waits, size, deadline, done))
        self._tasks.add(task)
        task.add_done_callback(self._request_done)
        self._update_room()

    def _request_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._update_room()

    @staticmethod
    def _server_error(request: frames.AppendRequest, exc: Exception) -> bytes:
        log.error("append request %d failed", request.correlation_id, exc_info=exc)
        return frames.encode_error_response(request.correlation_id, errors.UnknownServerError(repr(exc)))

    async def _serve_request(
        self, request: frames.AppendRequest, waits, size: int, deadline: float, done: list[AppendResult]
    ) -> None:
        """Serve ``request``, whose first ``len(done)`` partitions were appended already."""
        try:
            with self._span(request):
                if request.acks is not Acks.ALL:
                    results = await self._append_one_by_one(request, waits, deadline, done)
                else:  # each waits for its in-sync replicas: side by side
                    appends = [
                        self._append_in_order(request, p, previous, mine, deadline)
                        for p, (previous, mine) in zip(request.partitions, waits, strict=True)
                    ]
                    outcomes = await asyncio.gather(*appends, return_exceptions=True)
                    results = [
                        _failed(p, outcome) if isinstance(outcome, BaseException) else outcome
                        for p, outcome in zip(request.partitions, outcomes, strict=True)
                    ]
            answer = frames.encode_response(request.correlation_id, results)
        except Exception as exc:  # noqa: BLE001 -- a bug (logged): answered, not left waiting
            answer = self._server_error(request, exc)
        finally:
            self._in_flight_bytes -= size
        self._send(answer)

    def _append_ready(
        self, request: frames.AppendRequest, waits, deadline: float, results: list[AppendResult]
    ) -> None:
        """Append the partitions of an acks 0/1 request after the ``len(results)`` done, in
        order, for as long as each one's turn has come and ``append_now`` takes it (adding
        their results to ``results``); stops at the first that must wait."""
        append_now = self._append_now
        if append_now is None:
            return
        partitions = request.partitions
        for index in range(len(results), len(partitions)):
            p = partitions[index]
            previous, mine = waits[index]
            if previous is not None and not previous.done:
                return
            result = self._append_at_once(append_now, request, p, mine, deadline)
            if result is None:
                return
            results.append(result)

    async def _append_one_by_one(
        self, request: frames.AppendRequest, waits, deadline: float, results: list[AppendResult]
    ) -> list[AppendResult]:
        """An acks 0/1 request's appends after the ``len(results)`` done, one after another:
        each is done once written, which it is without waiting (short of a transaction check,
        or an earlier append of the partition not written yet), so a task per partition -- a
        fifth of a node's time for frames of hundreds of partitions -- would buy nothing. A
        partition whose turn has come is appended with ``append_now`` (no coroutine); one that
        must wait takes ``_append_in_order``."""
        results = list(results)
        append_now = self._append_now
        for index in range(len(results), len(request.partitions)):
            p = request.partitions[index]
            previous, mine = waits[index]
            result = None
            if append_now is not None and (previous is None or previous.done):
                result = self._append_at_once(append_now, request, p, mine, deadline)
            if result is None:
                try:
                    result = await self._append_in_order(request, p, previous, mine, deadline)
                except Exception as exc:  # noqa: BLE001 -- a bug: answered, the others still go
                    result = _failed(p, exc)
            results.append(result)
        return results

    def _append_at_once(
        self,
        append_now: Callable[..., AppendResult | None],
        request: frames.AppendRequest,
        p: frames.PartitionAppend,
        mine: _Turn,
        deadline: float,
    ) -> AppendResult | None:
        """``_append_in_order`` for a partition whose turn has come, without a coroutine: its
        result, or None (nothing done, the turn still open) when the append must wait. An
        unexpected error (a bug) is this partition's answer, and the others still go."""
        if deadline - self._loop.time() <= 0:
            self._finish_turn(p, mine)
            return self._refused(request, p)
        try:
            result = append_now(
                p.topic,
                p.partition,
                p.records,
                acks=request.acks,
                leader_epoch=None if p.leader_epoch == frames.NO_EPOCH else p.leader_epoch,
            )
        except Exception as exc:  # noqa: BLE001 -- a bug: answered, the others still go
            self._finish_turn(p, mine)
            return _failed(p, exc)
        if result is not None:
            self._finish_turn(p, mine)
        return result

    def _finish_turn(self, p: frames.PartitionAppend, mine: _Turn) -> None:
        """The partition's append is written or failed: the next one of it may go."""
        mine.finish()
        key = (p.topic, p.partition)
        if self._tails.get(key) is mine:
            del self._tails[key]

    def _span(self, request: frames.AppendRequest):
        """The request's SERVER span and timing (telemetry on), current while it is served; a
        probe (no partitions) is not an append and goes unobserved."""
        telemetry = self._telemetry
        if telemetry is None or not request.partitions:
            return _NO_SPAN
        return telemetry.data_port_append_span(request.trace_context)

    async def _append_in_order(
        self,
        request: frames.AppendRequest,
        p: frames.PartitionAppend,
        previous: _Turn | None,
        mine: _Turn,
        deadline: float,
    ) -> AppendResult:
        """Append ``p`` once the previous append of its partition on this connection is written.
        An append that would start after its deadline (counted from when its frame was read) is
        refused, not written: the gateway has given up on it (or is about to) and may retry it,
        and writing it then would duplicate it."""
        key = (p.topic, p.partition)

        def written() -> None:
            mine.finish()
            if self._tails.get(key) is mine:
                del self._tails[key]

        try:
            if previous is not None and not previous.done:
                try:
                    async with asyncio.timeout_at(deadline):
                        await asyncio.shield(previous.waiter(self._loop))
                except TimeoutError:
                    return self._refused(request, p)
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return self._refused(request, p)
            return await self._appender.append(
                p.topic,
                p.partition,
                p.records,  # type: ignore[arg-type]  # a view into the frame: the log takes any buffer
                acks=request.acks,
                timeout_s=remaining,
                leader_epoch=None if p.leader_epoch == frames.NO_EPOCH else p.leader_epoch,
                written=written,
            )
        finally:
            if previous is not None and not previous.done:
                # Refused (or cancelled) while the one before is not written yet: the next
                # append of the partition still waits for that one.
                previous.waiter(self._loop).add_done_callback(lambda _previous: written())
            else:
                written()

    def _refused(self, request: frames.AppendRequest, p: frames.PartitionAppend) -> AppendResult:
        self._stats.append_errors += 1
        return AppendResult(
            p.topic,
            p.partition,
            error=errors.RequestTimedOutError(
                f"append to {p.topic}-{p.partition} not started within its {request.timeout_ms} ms "
                "(it waited behind an earlier one); nothing written"
            ),
        )

    # ---- writing ---------------------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        """Queue an answer; the answers completed in one turn of the event loop go out in one
        send (``_flush``), instead of one system call each."""
        if self._broken:
            return
        self._unsent.append(frame)
        self._unsent_bytes += len(frame)
        if not self._flush_scheduled and (self._sender is None or self._sender.done()):
            self._flush_scheduled = True
            if not self._reading:
                self._loop.call_soon(self._flush)

    def _flush_before_waiting(self) -> None:
        """The read loop is about to wait (for bytes, for room, for a turn of the loop): the
        answers of the requests it served go now. A one-at-a-time client's answer so leaves
        in the turn its request was read in, and no turn is spent on the flush."""
        if self._flush_scheduled:
            self._flush()

    def _flush(self) -> None:
        """Send what is queued if the socket takes it, else hand the rest to the sender task."""
        self._flush_scheduled = False
        if self._broken or not self._unsent or (self._sender is not None and not self._sender.done()):
            return
        data = self._unsent[0] if len(self._unsent) == 1 else b"".join(self._unsent)
        self._unsent.clear()
        self._unsent_bytes = 0
        try:
            sent = self._link.try_send(data)
        except OSError:
            self._broken = True
            return
        if sent < len(data):
            self._unsent.append(data[sent:])
            self._unsent_bytes = len(data) - sent
            self._sender = self._loop.create_task(self._send_routine())
        self._update_room()

    async def _send_routine(self) -> None:
        try:
            while self._unsent:
                data = b"".join(self._unsent)
                self._unsent.clear()
                self._unsent_bytes = 0
                self._update_room()
                await self._link.sendall(data)
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
        self._flush_before_waiting()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._refusal is not None:
            self._send(self._refusal)
        self._flush()
        if self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)
        if not self._broken:
            with contextlib.suppress(OSError):
                await self._link.drain()


class _Turn:
    """One append's place in its partition's line on a connection: done once it is written (or
    failed). The future a later append of the partition waits on is made only when one does:
    most appends have no successor in flight, and a future per partition of every frame was a
    fifth of a node's time for frames of hundreds of partitions."""

    __slots__ = ("_waiter", "done")

    def __init__(self) -> None:
        self.done = False
        self._waiter: asyncio.Future[None] | None = None

    def waiter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done when this turn is."""
        if self._waiter is None:
            self._waiter = loop.create_future()
            if self.done:
                self._waiter.set_result(None)
        return self._waiter

    def finish(self) -> None:
        self.done = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _failed(p: frames.PartitionAppend, exc: BaseException) -> AppendResult:
    """A partition whose append raised (a bug: ``append`` answers its errors): its own error,
    so the other partitions of the request keep their results."""
    log.error("append to %s-%d raised", p.topic, p.partition, exc_info=exc)
    return AppendResult(p.topic, p.partition, error=errors.UnknownServerError(repr(exc)))
