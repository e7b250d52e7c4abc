"""An asyncio client for a storage node's fetch port (used by the gateway, tools and tests).

One request is in flight per connection (the server answers in order); a :class:`FetchClient`
keeps a small pool of connections to one node so concurrent fetches run in parallel.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from services import errors
from services.fetchport import multi, protocol


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One partition's answer. For a read_committed fetch ``header.high_watermark`` is the last
    stable offset (what the reader may read up to), and ``aborted`` lists the aborted
    transactions overlapping the records as ``(producer id, first offset)``."""

    header: protocol.FetchResponseHeader
    records: bytes
    aborted: tuple[tuple[int, int], ...] = ()


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

    async def round_trip_committed(self, request: multi.MultiFetchRequest) -> FetchResult:
        """A one-partition read_committed fetch (version-1 frames), as a :class:`FetchResult`."""
        self.writer.write(multi.encode_request(request))
        await self.writer.drain()
        (size,) = protocol.SIZE.unpack(await self.reader.readexactly(4))
        if size < 0 or size > protocol.MAX_RESPONSE_FRAME:
            raise errors.CorruptRecordError(f"fetch response frame size {size} is out of range")
        response = multi.decode_response_body(await self.reader.readexactly(size))
        if response.correlation_id not in (request.correlation_id, -1):
            raise errors.CorruptRecordError(
                f"fetch response for correlation id {response.correlation_id}, "
                f"expected {request.correlation_id}"
            )
        if response.error_code or not response.partitions:
            header = protocol.FetchResponseHeader(
                response.correlation_id, response.error_code, -1, -1, -1, response.message, 0
            )
            return FetchResult(header, b"")
        part = response.partitions[0]
        h = part.header
        header = protocol.FetchResponseHeader(
            response.correlation_id,
            h.error_code,
            h.last_stable_offset if h.error_code == 0 else h.high_watermark,
            h.log_start_offset,
            h.log_end_offset,
            h.message,
            h.records_length,
        )
        return FetchResult(header, bytes(part.records), h.aborted)

    def close(self) -> None:
        self.writer.close()


class FetchClient:
    """Fetches from one storage node's fetch port over up to ``max_connections`` connections."""

    def __init__(
        self, host: str, port: int, *, max_connections: int = 4, connect_timeout: float = 5.0
    ) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._correlation = itertools.count(1)
        self._connect_timeout = connect_timeout

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 20), self._connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            raise errors.BrokerNotAvailableError(
                f"cannot reach fetch port {self.host}:{self.port}: {exc}"
            ) from exc
        return _Connection(reader, writer)

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
        correlation = next(self._correlation)
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                if read_committed:
                    result = await conn.round_trip_committed(
                        multi.MultiFetchRequest(
                            correlation,
                            multi.CONSUMER_REPLICA_ID,
                            (multi.PartitionFetch(topic, partition, offset, max_bytes),),
                            max_bytes,
                            min_bytes,
                            max_wait_ms,
                            multi.READ_COMMITTED,
                        )
                    )
                else:
                    result = await conn.round_trip(
                        protocol.FetchRequest(
                            correlation, topic, partition, offset, max_bytes, min_bytes, max_wait_ms
                        )
                    )
            except (OSError, asyncio.IncompleteReadError) as exc:
                conn.close()
                raise errors.NetworkError(f"fetch from {self.host}:{self.port} failed: {exc!r}") from exc
            except BaseException:
                conn.close()
                raise
            if result.header.correlation_id == -1:
                conn.close()  # the node answers -1 to what it will not serve, then closes
            else:
                self._idle.append(conn)
            return result

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
