"""An asyncio client for a storage node's fetch port (used by the gateway, tools and tests).

One request is in flight per connection (the server answers in order); a :class:`FetchClient`
keeps a small pool of connections to one node so concurrent fetches run in parallel.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, TypeVar

from services import errors
from services.correlation_ids import correlation_ids
from services.fetchport import multi, protocol
from services.tls import ReloadingClientContext


class FetchResult(NamedTuple):
    """One partition's answer (a tuple: a wide fetch makes one per partition). For a
    read_committed fetch ``header.high_watermark`` is the last stable offset (what the reader may
    read up to), and ``aborted`` lists the aborted transactions overlapping the records as
    ``(producer id, first offset)``."""

    header: protocol.FetchResponseHeader
    records: bytes
    aborted: tuple[tuple[int, int], ...] = ()

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id


#: How long a node that refused version-1 frames is served one partition per request before it
#: is asked again.
MULTI_RECHECK_S = 60.0
#: The start of every response layout: correlation id, error code.
_REFUSAL = struct.Struct(">ih")
_UNSUPPORTED_VERSION = errors.UnsupportedVersionError.kafka_code

_Answer = TypeVar("_Answer", FetchResult, multi.MultiFetchResponse)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def round_trip(self, request: protocol.FetchRequest) -> FetchResult:
        self.writer.write(protocol.encode_request(request))
        await self.writer.drain()
        (size,) = protocol.SIZE.unpack(await self.reader.readexactly(4))
        if size < protocol.RESPONSE_FIXED_SIZE + 4 or size > protocol.MAX_RESPONSE_FRAME:
            raise errors.CorruptRecordError(f"fetch response frame size {size} is out of range")
        fixed = await self.reader.readexactly(protocol.RESPONSE_FIXED_SIZE)
        prefix_length = protocol.response_prefix_length(fixed)
        rest = await self.reader.readexactly(prefix_length - protocol.RESPONSE_FIXED_SIZE)
        header = protocol.decode_response_header(fixed + rest, size)
        records = await self.reader.readexactly(header.records_length) if header.records_length else b""
        if header.correlation_id not in (request.correlation_id, -1):
            raise errors.CorruptRecordError(
                f"fetch response for correlation id {header.correlation_id}, "
                f"expected {request.correlation_id}"
            )
        return FetchResult(header, records)

    async def round_trip_multi(self, request: multi.MultiFetchRequest) -> multi.MultiFetchResponse:
        """One version-1 (many partitions) request and its whole answer."""
        self.writer.write(multi.encode_request(request))
        await self.writer.drain()
        (size,) = protocol.SIZE.unpack(await self.reader.readexactly(4))
        if size < 0 or size > protocol.MAX_RESPONSE_FRAME:
            raise errors.CorruptRecordError(f"fetch response frame size {size} is out of range")
        body = await self.reader.readexactly(size)
        if len(body) >= _REFUSAL.size and _REFUSAL.unpack_from(body)[1] == _UNSUPPORTED_VERSION:
            # A node that speaks only version 0 refuses in its own layout (the correlation id
            # and error code come first in both), then closes.
            raise errors.UnsupportedVersionError(
                f"fetch port {self.writer.get_extra_info('peername')} does not speak version-1 frames"
            )
        response = multi.decode_response_body(body)
        if response.correlation_id not in (request.correlation_id, -1):
            raise errors.CorruptRecordError(
                f"fetch response for correlation id {response.correlation_id}, "
                f"expected {request.correlation_id}"
            )
        return response

    def close(self) -> None:
        self.writer.close()


class FetchClient:
    """Fetches from one storage node's fetch port over up to ``max_connections`` connections."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int = 4,
        connect_timeout: float = 5.0,
        ssl: ReloadingClientContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: TLS to the fetch port (a member certificate: mutual TLS); None: plaintext.
        self._ssl = ssl
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._correlation = correlation_ids()
        self._connect_timeout = connect_timeout
        #: Event-loop time until which the node is taken not to speak version-1 frames (it
        #: refused them: an older node), so one partition goes per request (see ``fetch_many``);
        #: asked again after that, as the node may have been upgraded in place.
        self._multi_refused_until = 0.0
        #: Likewise for version-3 (sparse) frames; version 1 is used meanwhile.
        self._sparse_refused_until = 0.0

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    limit=1 << 20,
                    ssl=self._ssl.context if self._ssl is not None else None,
                    server_hostname=self._ssl.server_hostname(self.host) if self._ssl is not None else None,
                ),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise errors.BrokerNotAvailableError(
                f"cannot reach fetch port {self.host}:{self.port}: {exc}"
            ) from exc
        return _Connection(reader, writer)

    @property
    def speaks_multi(self) -> bool:
        """Whether to send this node version-1 (many partitions) requests now."""
        return asyncio.get_running_loop().time() >= self._multi_refused_until

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        min_bytes: int = 1,
        max_wait_ms: int = 0,
        read_committed: bool = False,
    ) -> FetchResult:
        """One fetch. Server-side errors are returned in ``result.header`` (see ``.error()``);
        connection failures raise BrokerNotAvailableError / NetworkError. ``read_committed``:
        only below the last stable offset, with the aborted transactions (see FetchResult)."""
        if read_committed:
            (result,) = await self.fetch_many(
                [multi.PartitionFetch(topic, partition, offset, max_bytes)],
                max_bytes=max_bytes,
                min_bytes=min_bytes,
                max_wait_ms=max_wait_ms,
                read_committed=True,
            )
            return result
        request = protocol.FetchRequest(
            next(self._correlation), topic, partition, offset, max_bytes, min_bytes, max_wait_ms
        )
        return await self._exchange(lambda conn: conn.round_trip(request))

    async def fetch_many_sparse(
        self,
        partitions: Sequence[multi.PartitionFetch],
        *,
        max_bytes: int,
        min_bytes: int = 1,
        max_wait_ms: int = 0,
        read_committed: bool = False,
    ) -> list[FetchResult | None]:
        """``fetch_many`` in version 3: None for each partition the node left out (nothing to
        read, no error, the ``known_*`` offsets of its ``PartitionFetch`` unchanged). A node that
        refuses version 3 is asked in version 1 (and again in version 3 only after
        ``MULTI_RECHECK_S``)."""
        loop = asyncio.get_running_loop()
        if loop.time() >= self._sparse_refused_until:
            request = self._multi_request(partitions, max_bytes, min_bytes, max_wait_ms, read_committed, True)
            try:
                response = await self._exchange(lambda conn: conn.round_trip_multi(request))
            except (errors.UnsupportedVersionError, errors.CorruptRecordError):
                self._sparse_refused_until = loop.time() + MULTI_RECHECK_S
            else:
                if response.correlation_id != -1:
                    return _sparse_results(response, request)
                self._sparse_refused_until = loop.time() + MULTI_RECHECK_S  # refused as a bad frame
        return list(
            await self.fetch_many(
                partitions,
                max_bytes=max_bytes,
                min_bytes=min_bytes,
                max_wait_ms=max_wait_ms,
                read_committed=read_committed,
            )
        )

    def _multi_request(
        self,
        partitions: Sequence[multi.PartitionFetch],
        max_bytes: int,
        min_bytes: int,
        max_wait_ms: int,
        read_committed: bool,
        sparse: bool,
    ) -> multi.MultiFetchRequest:
        return multi.MultiFetchRequest(
            next(self._correlation),
            multi.CONSUMER_REPLICA_ID,
            tuple(partitions),
            max_bytes,
            min_bytes,
            max_wait_ms,
            multi.READ_COMMITTED if read_committed else multi.READ_UNCOMMITTED,
            sparse,
        )

    async def fetch_many(
        self,
        partitions: Sequence[multi.PartitionFetch],
        *,
        max_bytes: int,
        min_bytes: int = 1,
        max_wait_ms: int = 0,
        read_committed: bool = False,
    ) -> list[FetchResult]:
        """One version-1 request for many partitions of this node: a result per partition, in
        order. The node long-polls until ``min_bytes`` are available across them (or an error is
        to be reported, or ``max_wait_ms`` passed), and bounds the record bytes by ``max_bytes``
        (the first batch goes whole). A request-level error becomes every partition's error."""
        request = self._multi_request(partitions, max_bytes, min_bytes, max_wait_ms, read_committed, False)
        try:
            response = await self._exchange(lambda conn: conn.round_trip_multi(request))
        except errors.UnsupportedVersionError:
            self._multi_refused_until = asyncio.get_running_loop().time() + MULTI_RECHECK_S
            raise
        return _results(response, request)

    async def _exchange(self, round_trip: Callable[[_Connection], Awaitable[_Answer]]) -> _Answer:
        """Run one round trip on a pooled (or new) connection; failures close the connection."""
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                answer = await round_trip(conn)
            except (OSError, asyncio.IncompleteReadError) as exc:
                conn.close()
                raise errors.NetworkError(f"fetch from {self.host}:{self.port} failed: {exc!r}") from exc
            except BaseException:
                conn.close()
                raise
            if answer.correlation_id == -1:
                conn.close()  # the node answers -1 to what it will not serve, then closes
            else:
                self._idle.append(conn)
            return answer

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def _results(response: multi.MultiFetchResponse, request: multi.MultiFetchRequest) -> list[FetchResult]:
    """A version-1 answer as one :class:`FetchResult` per requested partition, in order. For
    read_committed the header's high watermark is the last stable offset (what may be read)."""
    committed = request.isolation_level == multi.READ_COMMITTED
    answered = [(p.header.topic, p.header.partition) for p in response.partitions]
    asked = [(p.topic, p.partition) for p in request.partitions]
    if response.error_code or answered != asked:
        code = response.error_code or errors.CorruptRecordError.kafka_code
        message = response.message or (
            f"the node answered {len(answered)} partitions that are not the {len(asked)} asked for"
        )
        header = protocol.FetchResponseHeader(response.correlation_id, code, -1, -1, -1, message, 0)
        return [FetchResult(header, b"") for _ in request.partitions]
    return [_result(part, response.correlation_id, committed) for part in response.partitions]


def _result(part: multi.PartitionData, correlation_id: int, committed: bool) -> FetchResult:
    h = part.header
    header = protocol.FetchResponseHeader(
        correlation_id,
        h.error_code,
        h.last_stable_offset if committed and h.error_code == 0 else h.high_watermark,
        h.log_start_offset,
        h.log_end_offset,
        h.message,
        h.records_length,
    )
    return FetchResult(header, bytes(part.records), h.aborted)


def _sparse_results(
    response: multi.MultiFetchResponse, request: multi.MultiFetchRequest
) -> list[FetchResult | None]:
    """A version-3 answer as one result per requested partition, in order: None for those left
    out. An answer naming a partition not asked for, or out of order, fails every partition (as
    a request-level error does)."""
    committed = request.isolation_level == multi.READ_COMMITTED
    asked = request.partitions
    results: list[FetchResult | None] = [None] * len(asked)
    last = -1
    for part in response.partitions:
        # The answer follows the request's order: look for each partition after the last one
        # (a walk over the request, not an index of it: most of a wide request is left out).
        topic, number = part.header.topic, part.header.partition
        at = last + 1
        while at < len(asked) and (asked[at].partition != number or asked[at].topic != topic):
            at += 1
        if response.error_code or at >= len(asked):
            code = response.error_code or errors.CorruptRecordError.kafka_code
            message = response.message or "the node answered partitions not asked for, or out of order"
            header = protocol.FetchResponseHeader(response.correlation_id, code, -1, -1, -1, message, 0)
            return [FetchResult(header, b"") for _ in request.partitions]
        results[at] = _result(part, response.correlation_id, committed)
        last = at
    if response.error_code:
        header = protocol.FetchResponseHeader(
            response.correlation_id, response.error_code, -1, -1, -1, response.message, 0
        )
        return [FetchResult(header, b"") for _ in request.partitions]
    return results
