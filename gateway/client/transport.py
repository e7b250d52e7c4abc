"""How produce requests travel: pipelined on a ``ProduceStream``, or one unary ``Produce`` each.

The sender only calls ``await transport.send(request, timeout_s)`` and gets the response or a
``TributaryError``; whether requests share a stream is this module's business.

* :class:`StreamTransport` (the default) keeps one bidirectional ``ProduceStream`` open and writes
  requests without waiting for answers; the gateway answers in request order, each answer
  echoing its ``correlation_id``. Measured on loopback with grpcio 1.85, a pipelined stream
  carries about 4x the requests per second of sequential unary calls (~7,000/s vs ~1,800/s),
  which is what lets small batches (and the paper's one-record-per-request run) go fast.
* :class:`UnaryTransport` makes one ``Produce`` call per request; used when a gateway does not
  implement the stream.

With ``acks=0`` a request is done once it is written to the stream, as Kafka's producer counts
a record sent once it is in the socket buffer: the gateway still answers, but nobody waits for
it, so the pipeline is bounded by the stream's flow control, not by answers in flight (offsets
are then unknown: -1). Measured with ``bench/paper.py``'s unbatched acks=0 row, this took one
record per request from ~2,500 to ~4,000 msg/s: the gateway's stream reading is then the limit.

When a stream breaks, every request waiting on it fails. If the gateway ended the stream with an
error status, the first unanswered request is the one it was processing and gets that error; the
others get a retriable ``NetworkError`` (they were never looked at). The next request opens a new
stream -- also after the gateway ended an idle one (its ``produce_stream_max_idle_ms``, 10 min).

Idle streams: a stream with nothing written or read for ``max_idle_s`` (the producer's
``connections_max_idle_ms``, 9 min as in Kafka's producer, a minute under the gateway's 10) is
ended by the client before the next request goes out on a new one. Kafka picks its client
default below the broker's for the same reason: a request written the moment the server gives
up on the stream would be lost, and an acks=0 request would be lost without anyone knowing.

Client quotas: an answer's ``throttle_time_ms`` holds the next requests to that gateway that
long (:mod:`gateway.client.throttle`); on a stream they wait in order, under its write lock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import grpc

from gateway.client.channel import Endpoint
from gateway.client.client import GatewayClient
from gateway.client.errors import NetworkError, RequestTimedOutError, TributaryError, UnsupportedVersionError
from services.proto import pb

log = logging.getLogger(__name__)

#: Kafka's producer default for connections.max.idle.ms (540000 ms), below the gateway's 10 min.
DEFAULT_MAX_IDLE_S = 540.0


class UnaryTransport:
    """One ``Gateway.Produce`` call per request. Concurrent calls may be served in any order."""

    preserves_order = False

    def __init__(self, client: GatewayClient) -> None:
        self._client = client

    async def send(self, request, timeout_s: float):
        throttle = self._client.produce_throttles.of(self._client.pool.current().address)
        await throttle.wait()
        response = await self._client.call(
            "Produce", request, timeout_ms=int(timeout_s * 1000), failover=False
        )
        throttle.observe(response.throttle_time_ms)
        return response

    async def close(self, timeout_s: float = 30.0) -> None:
        pass


def unacked_response(request):
    """The answer an acks=0 request gets without waiting: every partition sent, offsets unknown."""
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


class _Stream:
    """One open ``ProduceStream`` call with the futures of its unanswered requests, in order."""

    def __init__(self, endpoint: Endpoint, call, now: float) -> None:
        self.endpoint = endpoint
        self.call = call
        self.pending: dict[int, asyncio.Future] = {}
        self.write_lock = asyncio.Lock()
        self.reader: asyncio.Task | None = None
        self.broken = False
        #: Event-loop time of the last write or answer.
        self.last_active = now
        #: The gateway has answered on this stream, so it implements ProduceStream: from then on
        #: acks=0 requests need not wait for their answers (see ``StreamTransport.send``).
        self.confirmed = False


class StreamTransport:
    """Requests pipelined over one ``ProduceStream`` per client; see the module docstring.

    The gateway appends a stream's requests to each partition in the order they were written.
    """

    @property
    def preserves_order(self) -> bool:
        """Requests are appended in the order they are written: on the stream, not once the
        producer fell back to unary calls (a gateway without ProduceStream)."""
        return self._unary is None

    def __init__(self, client: GatewayClient, *, max_idle_s: float | None = DEFAULT_MAX_IDLE_S) -> None:
        self._client = client
        self._stream: _Stream | None = None
        self._correlation = itertools.count(1)
        self._unary: UnaryTransport | None = None
        #: Streams idle this long are ended before the next request (None: never).
        self._max_idle_s = max_idle_s
        self._retiring: set[asyncio.Task] = set()

    async def send(self, request, timeout_s: float):
        if self._unary is not None:
            return await self._unary.send(request, timeout_s)
        stream = self._open_stream()
        request.correlation_id = next(self._correlation)
        # acks=0 goes fire-and-forget only on a stream the gateway has answered on: until then an
        # answer may still be UNIMPLEMENTED (a gateway without ProduceStream), and a request that
        # did not wait for it would be reported sent and lost instead of resent as a unary call.
        if request.acks == pb.ACKS_NONE and stream.confirmed:
            await self._write(stream, request)
            if stream.broken:
                raise NetworkError(
                    f"produce stream to {stream.endpoint.address} closed before the request was sent"
                )
            return unacked_response(request)
        future = asyncio.get_running_loop().create_future()
        stream.pending[request.correlation_id] = future
        await self._write(stream, request)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            # A stream that does not answer in time is presumed stuck: start over on a new one.
            self._break(
                stream,
                RequestTimedOutError(
                    f"no produce answer from {stream.endpoint.address} within {timeout_s:.1f}s"
                ),
            )
            return await future
        except UnsupportedVersionError:
            log.info("gateway has no ProduceStream; falling back to unary Produce")
            self._unary = UnaryTransport(self._client)
            return await self._unary.send(request, timeout_s)

    def _open_stream(self) -> _Stream:
        loop = asyncio.get_running_loop()
        self._maybe_retire_idle_stream(loop.time())
        if self._stream is None or self._stream.broken:
            endpoint = self._client.pool.current()
            stream = _Stream(endpoint, endpoint.stub.ProduceStream(), loop.time())
            stream.reader = loop.create_task(self._read_routine(stream))
            self._stream = stream
        return self._stream

    def _maybe_retire_idle_stream(self, now: float) -> None:
        """End the current stream if it has been idle ``max_idle_s`` (see the module docstring)."""
        stream = self._stream
        if (
            stream is None
            or stream.broken
            or self._max_idle_s is None
            or stream.pending
            or now - stream.last_active < self._max_idle_s
        ):
            return
        self._stream = None
        task = asyncio.get_running_loop().create_task(self._end_stream(stream, 5.0))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _write(self, stream: _Stream, request) -> None:
        stream.last_active = asyncio.get_running_loop().time()
        try:
            async with stream.write_lock:
                # Held by the gateway (a quota): wait in order, so no request overtakes another.
                await self._client.produce_throttles.of(stream.endpoint.address).wait()
                await stream.call.write(request)
        except Exception as exc:  # noqa: BLE001 -- RpcError, UsageError, InvalidStateError alike
            # Write failures carry no status; the reader reports the real one when it ends.
            # Until then make sure this request is not left waiting on a stream that is gone.
            self._break(stream, NetworkError(f"produce stream to {stream.endpoint.address} closed: {exc!r}"))

    async def _read_routine(self, stream: _Stream) -> None:
        error: TributaryError = NetworkError(f"produce stream to {stream.endpoint.address} ended")
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    break
                stream.confirmed = True
                stream.last_active = asyncio.get_running_loop().time()
                self._client.produce_throttles.of(stream.endpoint.address).observe(response.throttle_time_ms)
                future = stream.pending.pop(response.correlation_id, None)
                if future is not None and not future.done():
                    future.set_result(response)
                self._client.pool.mark_ok(stream.endpoint)
        except grpc.RpcError as exc:
            error = self._client.pool.translate(stream.endpoint, exc)
        except asyncio.CancelledError:
            error = NetworkError("produce stream closed by the client")
            raise
        finally:
            self._break(stream, error, first_only=not getattr(error, "retriable", True))

    def _break(self, stream: _Stream, error: TributaryError, *, first_only: bool = False) -> None:
        """Fail every unanswered request of ``stream`` and stop using it.

        With ``first_only`` (a non-retriable stream error) only the oldest unanswered request
        gets ``error``; the rest were never processed and get a retriable NetworkError.
        """
        stream.broken = True
        if not stream.call.done():
            stream.call.cancel()
        pending, stream.pending = stream.pending, {}
        for index, future in enumerate(pending.values()):
            if future.done():
                continue
            if first_only and index > 0:
                future.set_exception(
                    NetworkError(f"produce stream reset after an earlier request failed: {error}")
                )
            else:
                future.set_exception(error)

    async def close(self, timeout_s: float = 30.0) -> None:
        """End the stream once the gateway has read everything written (up to ``timeout_s``)."""
        stream, self._stream = self._stream, None
        if self._retiring:
            await asyncio.wait(self._retiring, timeout=timeout_s)
        if stream is not None:
            await self._end_stream(stream, timeout_s)

    async def _end_stream(self, stream: _Stream, timeout_s: float) -> None:
        try:
            if not stream.broken and not stream.call.done():
                await stream.call.done_writing()
                # The gateway answers every request, acks=0 ones too, and then ends the stream.
                # acks=0 requests are not waited for one by one, so some may still be on their
                # way: cancelling the stream now would drop them. Its end is the signal.
                if stream.reader is not None:
                    await asyncio.wait({stream.reader}, timeout=timeout_s)
        except Exception:  # noqa: BLE001 -- the stream is going away either way
            pass
        self._break(stream, NetworkError("producer closed"))
        if stream.reader is not None:
            stream.reader.cancel()
            try:
                await stream.reader
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 -- already reported
                pass
