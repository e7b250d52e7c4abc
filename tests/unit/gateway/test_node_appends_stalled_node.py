"""The gateway's data-port append link (``gateway/server/node_appends.py``) against a node that
answers the probe and then stops reading (frozen, or back-pressured by appends waiting for its
followers): every append ends within its timeout, retriably, instead of waiting in ``drain()``
for as long as TCP keeps the connection."""

from __future__ import annotations

import asyncio
import time

from gateway.server.node_appends import NodeAppends
from services.acks import Acks
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE

APPENDS = 40
TIMEOUT_S = 1.0


async def _stalled_node(stop: asyncio.Event):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
        await reader.readexactly(size)  # the probe
        writer.write(frames.encode_response(0, []))
        await writer.drain()
        await stop.wait()  # never reads again
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_appends_to_a_node_that_stopped_reading_end_within_their_timeout():
    async def scenario() -> list[tuple[float, str]]:
        stop = asyncio.Event()
        server = await _stalled_node(stop)
        port = server.sockets[0].getsockname()[1]
        appends = NodeAppends("127.0.0.1", port)
        data = b"x" * (1 << 20)  # enough to fill the socket buffers
        started = time.monotonic()

        async def one(i: int) -> tuple[float, str]:
            results = await appends.append("t", {i % 4: data}, acks=Acks.LEADER, timeout_s=TIMEOUT_S)
            assert results is not None, "the link was offered (the probe was answered)"
            (result,) = results.values()
            assert result.error is not None
            return time.monotonic() - started, result.error.reason

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(APPENDS))), 10)
        finally:
            stop.set()
            await appends.close()
            server.close()
            await server.wait_closed()

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == APPENDS
    assert max(took for took, _ in outcomes) < TIMEOUT_S + 1.0
    assert {reason for _, reason in outcomes} <= {"REQUEST_TIMED_OUT", "NETWORK_EXCEPTION"}
