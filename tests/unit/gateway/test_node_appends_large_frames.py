"""Large append frames go out in pieces (``_Link.send``), and no other frame lands between the
pieces: a node that parses every frame it reads gets each append's bytes whole, small and large
appends sent at the same time alike."""

from __future__ import annotations

import asyncio

from gateway.server import node_appends
from gateway.server.node_appends import NodeAppends
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE


def _answering_handler(received: list[tuple[int, bytes]]):
    """A connection handler that answers every frame, recording (partition, bytes) of each
    append it parsed."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
                request = frames.decode_request_body(await reader.readexactly(size))
                results = []
                for p in request.partitions:
                    received.append((p.partition, bytes(p.records)))
                    results.append(AppendResult(p.topic, p.partition, base_offset=0, last_offset=0))
                writer.write(frames.encode_response(request.correlation_id, results))
                await asyncio.sleep(0.001)  # read slower than the gateway writes
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


async def _checking_node(received: list[tuple[int, bytes]]):
    return await asyncio.start_server(_answering_handler(received), "127.0.0.1", 0)


def test_large_and_small_frames_sent_together_arrive_whole():
    payloads = {
        i: bytes([i]) * (3 * node_appends.WRITE_PIECE_BYTES + 17 if i % 3 == 0 else 100 + i)
        for i in range(12)
    }

    async def scenario() -> tuple[list, list[tuple[int, bytes]]]:
        received: list[tuple[int, bytes]] = []
        server = await _checking_node(received)
        port = server.sockets[0].getsockname()[1]
        appends = NodeAppends("127.0.0.1", port)
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        appends.append("t", {i: data}, acks=Acks.LEADER, timeout_s=20)
                        for i, data in payloads.items()
                    )
                ),
                30,
            )
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()
        return answers, received

    answers, received = asyncio.run(scenario())
    for answer in answers:
        assert answer is not None
        ((_, result),) = answer.items()
        assert result.error is None, result.error
    assert sorted(received) == sorted(payloads.items())


def test_a_large_frame_cut_short_drops_the_connection_and_the_next_append_reconnects():
    async def scenario() -> tuple[object, dict, list[tuple[int, bytes]], int]:
        received: list[tuple[int, bytes]] = []
        node_handler = _answering_handler(received)
        connections = 0

        async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await node_handler(reader, writer)

        server = await asyncio.start_server(counting, "127.0.0.1", 0)
        appends = NodeAppends("127.0.0.1", server.sockets[0].getsockname()[1])
        big = b"z" * (64 * node_appends.WRITE_PIECE_BYTES)
        try:
            task = asyncio.ensure_future(appends.append("t", {0: big}, acks=Acks.LEADER, timeout_s=20))
            await asyncio.sleep(0.05)  # the probe is answered and some pieces are out
            task.cancel()
            (cancelled,) = await asyncio.gather(task, return_exceptions=True)
            after = await appends.append("t", {1: b"small"}, acks=Acks.LEADER, timeout_s=20)
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()
        return cancelled, after or {}, received, connections

    cancelled, after, received, connections = asyncio.run(scenario())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert after[1].error is None, after[1].error
    assert received == [(1, b"small")], "the cut-short frame was never parsed as a frame"
    assert connections == 2, "the cut-short connection was dropped and a new one opened"
