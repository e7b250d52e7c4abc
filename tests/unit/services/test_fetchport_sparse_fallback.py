"""A node that does not speak the fetch port's version 3 (sparse) is asked in version 1: the
client falls back at once, gets every partition, and stays on version 1 for a while."""

from __future__ import annotations

import asyncio
import struct

import pytest

from services import errors
from services.fetchport import multi, protocol
from services.fetchport.client import FetchClient


class OldNode:
    """A fetch port of before version 3: version-1 requests are answered (every partition at
    offset 0, high watermark 7); anything else gets the version-0 refusal, then a close."""

    def __init__(self, refusal: errors.TributaryError) -> None:
        self.refusal = refusal
        self.versions: list[int] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                body = await reader.readexactly(size)
                (version,) = struct.unpack_from(">h", body)
                self.versions.append(version)
                if version != multi.MULTI_FETCH_VERSION:
                    writer.write(protocol.encode_response_header(-1, error=self.refusal))
                    await writer.drain()
                    return
                request = multi.decode_request_body(body)
                headers = [
                    multi.encode_partition_header(
                        multi.PartitionHeader(p.topic, p.partition, high_watermark=7, log_start_offset=0)
                    )
                    for p in request.partitions
                ]
                writer.write(
                    multi.encode_response_prefix(request.correlation_id, len(headers), sum(map(len, headers)))
                    + b"".join(headers)
                )
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize(
    "refusal",
    [
        errors.UnsupportedVersionError("fetch request version 3 (this node speaks 0)"),
        errors.InvalidRequestError("fetch request frame size 9000 outside 1..4096"),
    ],
)
def test_a_node_refusing_version_3_is_asked_in_version_1(refusal):
    async def scenario():
        node = OldNode(refusal)
        port = await node.start()
        client = FetchClient("127.0.0.1", port)
        fetches = [multi.PartitionFetch("t", p, 0, 100, -1, -1, 7, 0) for p in range(3)]
        try:
            first = await client.fetch_many_sparse(fetches, max_bytes=1000)
            second = await client.fetch_many_sparse(fetches, max_bytes=1000)
        finally:
            await client.close()
            await node.stop()
        return node.versions, first, second

    versions, first, second = asyncio.run(scenario())
    # refused once, then version 1 at once and for the next fetch too
    assert versions == [multi.SPARSE_FETCH_VERSION, multi.MULTI_FETCH_VERSION, multi.MULTI_FETCH_VERSION]
    for results in (first, second):
        assert [r.header.high_watermark for r in results if r is not None] == [7, 7, 7]
