"""The gateway's appends to one storage node over the node's data port (pipelined frames).

One long-lived TCP connection per node carries every append the gateway sends it, many in
flight at once, each answered with its correlation id (``services/fetchport/append.py``). Frames
go out in the order :meth:`NodeAppends.append` is called, and the node applies one connection's
appends of a partition in that order, so the per-partition order the stream queues keep
(``append_queue.py``) holds on the wire too.

Failures read like a failed gRPC call, so the produce retry loop treats both alike: a lost
connection fails every append in flight on it with a retriable NETWORK_EXCEPTION (the next
append reconnects), an answer that does not come within the append's timeout is
REQUEST_TIMED_OUT. As over gRPC, an append that failed that way may still have been written
(at-least-once).

A node that does not take appends on its data port (an older node: it answers the opening
probe with UNSUPPORTED_VERSION; or any peer that closes or stays silent instead of answering the
probe) is remembered for :data:`UNSUPPORTED_RECHECK_S`, during which
:meth:`NodeAppends.append` returns None and the caller uses gRPC.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping

from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from gateway.server import answer_pass
from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.correlation_ids import correlation_ids
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE
from services.grpc_server import MAX_MESSAGE_BYTES
from services.telemetry import names
from services.telemetry.rpc import inject_metadata
from services.tls import ReloadingClientContext

log = logging.getLogger(__name__)

#: How long a node that refused appends on its data port is served over gRPC before asking again.
UNSUPPORTED_RECHECK_S = 60.0
#: Bound on an answer frame (they are ~60 bytes per partition): a foreign peer cannot make the
#: gateway allocate more.
MAX_RESPONSE_FRAME = 16 << 20
#: Wait for the socket to drain past this many unsent bytes (back-pressure on the callers).
WRITE_HIGH_WATER = 4 << 20
#: A frame larger than this goes out in pieces of this size, draining between them (see
#: :meth:`_Link.send`).
WRITE_PIECE_BYTES = 1 << 20


class _Unsupported(Exception):
    """The node answered the probe with UNSUPPORTED_VERSION."""


class _AnswerProtocol(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """The connection's protocol: answer frames are cut from the bytes as they arrive and
    handed to the link in the same callback -- no reading task to wake, so an append's answer
    reaches its caller one turn of the event loop sooner. The first frame (the probe's answer)
    goes to :attr:`first`, before there is a link."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        super().__init__(loop)
        self.name = name
        self.link: _Link | None = None
        self.first: asyncio.Future[bytes] = loop.create_future()
        #: Frames after the first that came before the link was made (none from a node).
        self._early: list[bytes] = []
        self._buffer = bytearray()

    def attach(self, link: _Link) -> None:
        self.link = link
        early, self._early = self._early, []
        for body in early:
            link.answer(body)

    def data_received(self, data: bytes) -> None:
        # The client answers the appends settle are written at the end of this callback (one
        # write per client connection), not a turn of the loop later.
        with answer_pass.handing_out():
            self._cut_answers(data)

    def _cut_answers(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= SIZE.size:
            (size,) = SIZE.unpack_from(buffer)
            if not 0 < size <= MAX_RESPONSE_FRAME:
                self._broken(
                    errors.CorruptRecordError(f"answer frame size {size} outside 1..{MAX_RESPONSE_FRAME}")
                )
                return
            end = SIZE.size + size
            if len(buffer) < end:
                return
            body = bytes(buffer[SIZE.size : end])
            del buffer[:end]  # O(1) at the front of a bytearray
            if self.link is not None:
                self.link.answer(body)
            elif not self.first.done():
                self.first.set_result(body)
            else:
                self._early.append(body)

    def _broken(self, error: errors.TributaryError) -> None:
        if not self.first.done():
            self.first.set_exception(error)
        if self.link is not None:
            self.link.fail(errors.NetworkError(f"{self.name} sent an unreadable answer: {error}"))
        self._buffer.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # wakes whoever waits in drain()
        if not self.first.done():
            self.first.set_exception(EOFError(f"{self.name} closed the connection: {exc!r}"))
        if self.link is not None and self.link.alive:
            self.link.fail(errors.NetworkError(f"the data-port connection to {self.name} was lost: {exc!r}"))


class _Link:
    """One open connection: its writer, and the appends awaiting answers (which its protocol
    hands to :meth:`answer` as they come)."""

    def __init__(self, writer: asyncio.StreamWriter, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = writer
        self.name = name
        self.loop = loop
        #: Appends awaiting answers: a future each, or a callback (``NodeAppends.append_now``).
        self.pending: dict[int, asyncio.Future[frames.AppendResponse] | _AnswerCallback] = {}
        #: One timer for the callbacks' deadlines (``watch``), armed for the earliest one that was
        #: due when it was set, and when it is due (inf: none armed).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.ids = correlation_ids()
        self.alive = True
        #: Held while a large frame goes out in pieces, so no other frame lands between them.
        self._sending = asyncio.Lock()

    async def send(self, parts: list[bytes | memoryview]) -> None:
        """Write one frame, whole, then wait while the socket is behind.

        A small frame is joined and written in one step. A large one is written a piece at a
        time, draining whenever the unsent bytes pass :data:`WRITE_HIGH_WATER`: handed whole
        to asyncio's transport, a 100 MB frame is copied into its buffer (twice, on a partial
        first send) and every later send moves the rest of that buffer down, which held the
        event loop -- every other client of the gateway -- for most of a second.
        """
        writer = self.writer
        size = sum(len(part) for part in parts)
        if size <= WRITE_PIECE_BYTES and not self._sending.locked():
            writer.write(b"".join(parts))
            if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await writer.drain()
            return
        async with self._sending:
            try:
                for part in parts:
                    view = memoryview(part)
                    for start in range(0, len(view), WRITE_PIECE_BYTES):
                        if not self.alive:
                            raise errors.NetworkError(f"the data-port connection to {self.name} was lost")
                        writer.write(view[start : start + WRITE_PIECE_BYTES])
                        if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                            await writer.drain()
            except BaseException:
                # Part of a frame is out (a timeout, the caller cancelled): the next frame would
                # read as its rest, so the connection goes and everything on it fails retriably.
                if self.alive:
                    self.fail(errors.NetworkError(f"an append frame to {self.name} was cut short"))
                raise

    def send_now(self, parts: list[bytes | memoryview]) -> bool:
        """Write a small frame at once when nothing holds the socket and it fits under the
        high-water mark (no drain due): True when written, False (nothing written) when
        :meth:`send` must do it."""
        if self._sending.locked():
            return False
        size = sum(len(part) for part in parts)
        transport = self.writer.transport
        if size > WRITE_PIECE_BYTES or transport.get_write_buffer_size() + size > WRITE_HIGH_WATER:
            return False
        transport.write(b"".join(parts))
        return True

    def answer(self, body: bytes) -> None:
        """An answer frame came: resolve its append (a connection-level error, or an answer
        that does not decode, fails them all)."""
        if not self.alive:
            return
        correlation_id = frames.response_correlation_id(body)
        if correlation_id == frames.CONNECTION_ERROR_ID:
            # Not knowing which append was refused, fail all in flight retriably (a bad frame
            # is the gateway's bug; the node wrote nothing of it).
            self.fail(
                errors.NetworkError(
                    f"{self.name} closed the data-port connection: {frames.connection_error(body)}"
                )
            )
            return
        try:
            response = frames.decode_response_body(body)
        except errors.TributaryError as exc:
            self.fail(errors.NetworkError(f"{self.name} sent an unreadable answer: {exc}"))
            return
        future = self.pending.pop(correlation_id, None)
        if future is not None and not future.done():
            future.set_result(response)

    def watch(self, waiter: _AnswerCallback) -> None:
        """Bound the wait for ``waiter``'s answer by its ``deadline``: one timer per connection,
        not one per append (a TimerHandle made, pushed on the loop's heap and cancelled, per
        request). As the deadlines of a connection's appends mostly come in the order they were
        sent, the timer is re-armed only for an earlier one."""
        if waiter.deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = waiter.deadline
            self._timer = self.loop.call_at(waiter.deadline, self._expire)

    def _expire(self) -> None:
        """The timer: the callbacks past their deadlines time out; armed again for the next."""
        self._timer, self._timer_at = None, math.inf
        now = self.loop.time()
        expired = [w for w in self.pending.values() if isinstance(w, _AnswerCallback) and w.deadline <= now]
        try:
            for waiter in expired:
                waiter.set_exception(TimeoutError())  # its deliver takes it out of pending
        finally:
            # Armed again even if a callback raised: the appends after it still time out (the
            # timer fires at once for those already past their deadline).
            waiting = [w for w in self.pending.values() if isinstance(w, _AnswerCallback) and not w.fired]
            if waiting:
                self.watch(min(waiting, key=_deadline))

    def fail(self, failure: errors.TributaryError) -> None:
        self.alive = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(failure)
        # abort, not close: frames still buffered here are dropped instead of sent (the appends
        # they carry were just failed, and their retries go out on another connection).
        self.writer.transport.abort()


class _AnswerCallback:
    """Stands in for an append's future in ``_Link.pending`` (the same ``done`` /
    ``set_result`` / ``set_exception``), for :meth:`NodeAppends.append_now`: the answer is
    handed to ``deliver`` in the callback that read it -- no task to wake, one turn of the event
    loop sooner. The wait ends at ``deadline`` (loop time) at the latest (``_Link.watch``)."""

    __slots__ = ("deadline", "deliver", "fired")

    def __init__(
        self,
        deliver: Callable[[frames.AppendResponse | None, BaseException | None], None],
        deadline: float,
    ) -> None:
        self.deliver = deliver
        self.deadline = deadline
        self.fired = False

    def done(self) -> bool:
        return self.fired

    def set_result(self, response: frames.AppendResponse) -> None:
        self._fire(response, None)

    def set_exception(self, error: BaseException) -> None:
        self._fire(None, error)

    def _fire(self, response: frames.AppendResponse | None, error: BaseException | None) -> None:
        if self.fired:
            return
        self.fired = True
        self.deliver(response, error)


def _deadline(waiter: _AnswerCallback) -> float:
    return waiter.deadline


def _answer_margin(timeout_s: float) -> float:
    """How much earlier than the gateway the node gives up on an append: a quarter of the time,
    at most 250 ms."""
    return min(0.25, timeout_s / 4)


def _time_out(future: asyncio.Future) -> None:
    """An append's answer did not come in time (its timer)."""
    if not future.done():
        future.set_exception(TimeoutError())


def _forget(link: _Link, correlation_id: int, future: asyncio.Future) -> None:
    """Stop waiting for an answer (a late one is dropped); an exception the future got
    meanwhile is taken, so asyncio does not report it as never retrieved."""
    link.pending.pop(correlation_id, None)
    if future.done() and not future.cancelled():
        future.exception()


class NodeAppends:
    """Appends to one storage node over its data port (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 5.0,
        tracer=None,
        tls: ReloadingClientContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: TLS to the node's data port (the gateway's member certificate); None: plaintext.
        self._tls = tls
        #: The gateway's tracer when telemetry is on: a CLIENT span per append, its context sent
        #: in the frame so the node's spans join the trace.
        self._tracer = tracer
        self._connect_timeout_s = connect_timeout_s
        self._name = f"{host}:{port}"
        self._link: _Link | None = None
        self._connecting: asyncio.Future[_Link] | None = None
        #: Loop time until which the node is served over gRPC (it refused the probe).
        self._unsupported_until = 0.0

    @property
    def usable(self) -> bool:
        """False while the node is known not to take appends on its data port."""
        # (the loop's clock only once refused: asking for the loop costs a system call in 3.11)
        return not self._unsupported_until or asyncio.get_running_loop().time() >= self._unsupported_until

    async def append(
        self,
        topic: str,
        payloads: Mapping[int, bytes | memoryview],
        *,
        acks: Acks,
        timeout_s: float,
        leader_epochs: Mapping[int, int] | None = None,
    ) -> dict[int, AppendResult] | None:
        """Append each partition's batches; None when the node takes no appends on its data
        port, or the request is beyond its frame bound (use gRPC). Failures are per-partition
        results, never exceptions."""
        if not self.usable:
            return None
        if self._tracer is None:
            return await self._append(topic, payloads, acks, timeout_s, leader_epochs, ())
        span = self._tracer.start_span(
            names.SPAN_DATA_PORT_APPEND,
            kind=SpanKind.CLIENT,
            attributes={
                names.RPC_SYSTEM_NAME: names.DATA_PORT_RPC_SYSTEM,
                names.RPC_METHOD: "Append",
                names.SERVER_ADDRESS: self.host,
                names.SERVER_PORT: self.port,
                names.MESSAGING_DESTINATION_NAME: topic,
            },
        )
        try:
            trace_context = tuple(inject_metadata(ctx=set_span_in_context(span)))
            results = await self._append(topic, payloads, acks, timeout_s, leader_epochs, trace_context)
            failed = [r.error for r in (results or {}).values() if r.error is not None]
            if failed:
                span.set_attribute(names.ERROR_TYPE, failed[0].reason)
                span.set_status(Status(StatusCode.ERROR, str(failed[0])))
            return results
        finally:
            span.end()

    def append_now(
        self,
        topic: str,
        payloads: Mapping[int, bytes | memoryview],
        *,
        acks: Acks,
        timeout_s: float | None = None,
        deadline: float | None = None,
        leader_epochs: Mapping[int, int] | None,
        done: Callable[[dict[int, AppendResult]], None],
    ) -> bool:
        """:meth:`append` without a coroutine, when it can be sent at once: the connection is
        open, telemetry off (no span to make), the frame small and the socket not behind. True
        when sent: ``done`` then hears each partition's result (or failure, as :meth:`append`
        returns them) exactly once, from the callback that read the answer (or the timer, or
        the connection's loss). False: nothing sent, :meth:`append` must do it. The wait is
        bounded by ``timeout_s`` from now, or by ``deadline`` (the loop's time)."""
        link = self._link
        if link is None or not link.alive or self._tracer is not None or self._unsupported_until:
            return False
        if self._frame_size(topic, payloads) > WRITE_PIECE_BYTES:
            return False  # not for send_now anyway
        now = link.loop.time()
        if timeout_s is None:
            if deadline is None:
                raise TypeError("append_now needs timeout_s or deadline")
            timeout_s = deadline - now
        correlation_id = next(link.ids)
        parts = frames.encode_request_parts(
            self._request(correlation_id, topic, payloads, acks, timeout_s, leader_epochs, ())
        )

        def deliver(response: frames.AppendResponse | None, error: BaseException | None) -> None:
            if response is not None:
                results = self._results(topic, payloads, response)
            else:
                link.pending.pop(correlation_id, None)
                if isinstance(error, TimeoutError):
                    failure: errors.TributaryError = self._timed_out(topic, timeout_s)
                elif isinstance(error, errors.TributaryError):
                    failure = error
                else:
                    failure = errors.NetworkError(repr(error))
                results = _all_failed(topic, payloads, failure)
            done(results)

        waiter = _AnswerCallback(deliver, now + max(timeout_s, 0.001))
        link.pending[correlation_id] = waiter
        if not link.send_now(parts):
            del link.pending[correlation_id]
            return False
        link.watch(waiter)
        return True

    @staticmethod
    def _frame_size(topic: str, payloads: Mapping[int, bytes | memoryview]) -> int:
        return frames.REQUEST_FIXED_SIZE + sum(len(d) + len(topic) + 14 for d in payloads.values())

    @staticmethod
    def _request(
        correlation_id: int,
        topic: str,
        payloads: Mapping[int, bytes | memoryview],
        acks: Acks,
        timeout_s: float,
        leader_epochs: Mapping[int, int] | None,
        trace_context: tuple[tuple[str, str], ...],
    ) -> frames.AppendRequest:
        epochs = leader_epochs or {}
        return frames.AppendRequest(
            correlation_id,
            acks,
            # The node refuses to start an append once this has passed since it read the frame
            # (it may wait behind an earlier append of the partition), and bounds acks=all by it;
            # the margin lets its answer -- written or refused -- reach us before we give up, so
            # an append we report as timed out is one the node did not start.
            max(1, int((timeout_s - _answer_margin(timeout_s)) * 1000)),
            tuple(
                frames.PartitionAppend(topic, p, data, epochs.get(p, frames.NO_EPOCH))
                for p, data in payloads.items()
            ),
            trace_context,
        )

    @staticmethod
    def _results(
        topic: str, payloads: Mapping[int, bytes | memoryview], response: frames.AppendResponse
    ) -> dict[int, AppendResult]:
        """Each partition's result in the node's answer."""
        if response.error is not None:
            return _all_failed(topic, payloads, response.error)
        results = {r.partition: r for r in response.results if r.topic == topic}
        if len(results) == len(payloads) and all(p in results for p in payloads):
            return results
        missing = errors.UnknownServerError("the storage node did not answer for this partition")
        return {p: results.get(p) or AppendResult(topic, p, error=missing) for p in payloads}

    def _timed_out(self, topic: str, timeout_s: float) -> errors.TributaryError:
        return errors.RequestTimedOutError(
            f"{self._name} did not answer an append of {topic} within {timeout_s:.3f} s"
        )

    async def _append(
        self,
        topic: str,
        payloads: Mapping[int, bytes | memoryview],
        acks: Acks,
        timeout_s: float,
        leader_epochs: Mapping[int, int] | None,
        trace_context: tuple[tuple[str, str], ...],
    ) -> dict[int, AppendResult] | None:
        try:
            link = await self._ensure_link(timeout_s)
        except _Unsupported:
            return None
        except (OSError, EOFError, TimeoutError, errors.TributaryError) as exc:
            error = exc if isinstance(exc, errors.TributaryError) else None
            error = error or errors.NetworkError(f"cannot reach {self._name} for appends: {exc!r}")
            return _all_failed(topic, payloads, error)
        if self._frame_size(topic, payloads) > MAX_MESSAGE_BYTES:
            return None  # beyond the node's frame bound: gRPC answers it as it always did
        correlation_id = next(link.ids)
        request = self._request(
            correlation_id, topic, payloads, acks, timeout_s, leader_epochs, trace_context
        )
        if not link.alive:  # lost while this append waited for it
            error = errors.NetworkError(f"the data-port connection to {self._name} was lost")
            return _all_failed(topic, payloads, error)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[frames.AppendResponse] = loop.create_future()
        link.pending[correlation_id] = future
        parts = frames.encode_request_parts(request)
        sent = False
        try:
            if link.send_now(parts):
                # The usual case: written at once; the wait for the answer is bounded by a
                # timer on its future (asyncio.timeout's context cost as much again per append).
                sent = True
                timer = loop.call_later(max(timeout_s, 0.001), _time_out, future)
                try:
                    response = await future
                finally:
                    timer.cancel()
            else:
                async with asyncio.timeout(max(timeout_s, 0.001)):
                    # A node that stopped reading holds this up: bounded by the timeout too.
                    await link.send(parts)
                    sent = True
                    response = await future
        except TimeoutError:
            _forget(link, correlation_id, future)
            if not sent:
                # Frames still in our buffer could reach the node later and be written after
                # we reported them timed out (and after their retries): the link is dropped so
                # they never leave, and every append on it fails retriably.
                link.fail(errors.NetworkError(f"{self._name} stopped reading appends"))
            return _all_failed(topic, payloads, self._timed_out(topic, timeout_s))
        except (OSError, errors.TributaryError) as exc:
            _forget(link, correlation_id, future)
            error = exc if isinstance(exc, errors.TributaryError) else errors.NetworkError(repr(exc))
            return _all_failed(topic, payloads, error)
        return self._results(topic, payloads, response)

    async def _ensure_link(self, timeout_s: float) -> _Link:
        link = self._link
        if link is not None and link.alive:
            return link
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected)
        async with asyncio.timeout(max(timeout_s, 0.001)):
            return await asyncio.shield(self._connecting)

    def _connected(self, attempt: asyncio.Future[_Link]) -> None:
        self._connecting = None
        if attempt.cancelled():
            return
        error = attempt.exception()
        if error is None:
            self._link = attempt.result()
            self._unsupported_until = 0.0
        elif isinstance(error, _Unsupported):
            log.info("%s takes no appends on its data port (%s): using gRPC", self._name, error)
            self._unsupported_until = asyncio.get_running_loop().time() + UNSUPPORTED_RECHECK_S

    async def _connect(self) -> _Link:
        """Open a connection and probe it (an append of no partitions, see the frame format).

        Raises _Unsupported when the peer answers the probe with anything but an empty version-2
        answer, or closes, or stays silent: an older node, or not a storage node at all.
        """
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            tls = self._tls
            transport, protocol = await loop.create_connection(
                lambda: _AnswerProtocol(loop, self._name),
                self.host,
                self.port,
                ssl=tls.context if tls is not None else None,
                server_hostname=tls.server_hostname(self.host) if tls is not None else None,
            )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                writer.write(frames.probe(0))
                body = await protocol.first
            if frames.response_correlation_id(body) == frames.CONNECTION_ERROR_ID:
                refusal = frames.connection_error(body)
                if refusal.retriable:  # e.g. the node's connection cap: try again later
                    raise refusal
                raise _Unsupported(str(refusal))
            answer = frames.decode_response_body(body)
            if answer.correlation_id != 0 or answer.error is not None:
                raise _Unsupported(f"answered the probe with {answer}")
        except (EOFError, TimeoutError, errors.CorruptRecordError) as exc:
            writer.close()
            raise _Unsupported(f"no version-2 answer to the probe: {exc!r}") from exc
        except BaseException:
            writer.close()
            raise
        link = _Link(writer, self._name, loop)
        protocol.attach(link)
        if transport.is_closing():  # lost between the probe's answer and now
            link.fail(errors.NetworkError(f"the data-port connection to {self._name} was lost"))
        return link

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        link, self._link = self._link, None
        if link is not None and link.alive:
            link.fail(errors.NetworkError(f"the data-port connection to {self._name} was closed"))


def _all_failed(
    topic: str, payloads: Mapping[int, bytes | memoryview], error: errors.TributaryError
) -> dict[int, AppendResult]:
    """The same failure for every partition of an append."""
    return {p: AppendResult(topic, p, error=error) for p in payloads}
