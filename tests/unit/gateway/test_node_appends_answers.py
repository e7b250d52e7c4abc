"""How the gateway's append connection reads a node's answers (``node_appends._AnswerProtocol``):
answers split across reads are put together and matched to their appends by correlation id;
an answer frame that cannot be read fails the appends in flight retriably, and the next append
opens a new connection."""

from __future__ import annotations

import asyncio
import struct

from gateway.server.node_appends import MAX_RESPONSE_FRAME, NodeAppends
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append as frames
from services.fetchport.protocol import SIZE


def _node(answer_bytes):
    """A node answering each connection's probe, then each append with the chunks
    ``answer_bytes(connection_number, request)`` gives, written apart."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(connections)
        connections.append(writer)
        try:
            while True:
                (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
                request = frames.decode_request_body(await reader.readexactly(size))
                if not request.partitions:  # the probe
                    writer.write(frames.encode_response(request.correlation_id, []))
                    continue
                for chunk in answer_bytes(number, request):
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(0.002)  # separate reads on the gateway's side
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle, connections


def _answer(request) -> bytes:
    p = request.partitions[0]
    offset = int(bytes(p.records))
    return frames.encode_response(
        request.correlation_id, [AppendResult(p.topic, p.partition, base_offset=offset, last_offset=offset)]
    )


def test_answers_cut_anywhere_reach_their_appends_and_a_bad_frame_fails_them_retriably():
    def answer_bytes(number, request):
        frame = _answer(request)
        if number == 0 and bytes(request.partitions[0].records) == b"7":
            return [struct.pack(">i", MAX_RESPONSE_FRAME + 1)]  # beyond the bound: unreadable
        if number == 0 and int(bytes(request.partitions[0].records)) % 2:
            return [frame[:3], frame[3:9], frame[9:]]  # one answer over three reads
        return [frame]

    async def scenario():
        handle, connections = _node(answer_bytes)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        appends = NodeAppends("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            first = [
                await appends.append("t", {0: b"%d" % i}, acks=Acks.LEADER, timeout_s=10) for i in range(7)
            ]
            broken = await appends.append("t", {0: b"7"}, acks=Acks.LEADER, timeout_s=10)
            again = await appends.append("t", {0: b"8"}, acks=Acks.LEADER, timeout_s=10)
            return first, broken, again, len(connections)
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()

    first, broken, again, connections = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [r[0].base_offset for r in first] == list(range(7))
    assert all(r[0].error is None for r in first)
    assert broken is not None and broken[0].error is not None
    assert broken[0].error.reason == "NETWORK_EXCEPTION" and broken[0].error.retriable
    assert again is not None and again[0].error is None and again[0].base_offset == 8
    assert connections == 2, "the unreadable answer dropped the connection; the next append made another"


def test_append_now_hears_its_answer_its_timeout_and_the_connections_loss_from_callbacks():
    """``append_now`` sends at once on an open connection and calls back exactly once per
    append: with the node's answer, REQUEST_TIMED_OUT when none comes in time, a retriable
    NETWORK_EXCEPTION when the connection is lost; it sends nothing before a connection is open."""

    def answer_bytes(number, request):
        value = bytes(request.partitions[0].records)
        if value == b"silent":
            return []
        if value == b"drop":
            return [struct.pack(">i", MAX_RESPONSE_FRAME + 1)]  # unreadable: the connection goes
        return [_answer(request)]

    async def scenario():
        handle, _connections = _node(answer_bytes)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        appends = NodeAppends("127.0.0.1", server.sockets[0].getsockname()[1])
        heard: dict[str, list[dict[int, AppendResult]]] = {}
        all_heard = asyncio.Event()

        def done(name):
            def hear(results):
                heard.setdefault(name, []).append(results)
                if {"5", "silent", "drop", "in-flight"} <= heard.keys():
                    all_heard.set()

            return hear

        try:
            before = appends.append_now(
                "t", {0: b"1"}, acks=Acks.LEADER, timeout_s=10, leader_epochs=None, done=done("1")
            )
            await appends.append("t", {0: b"2"}, acks=Acks.LEADER, timeout_s=10)  # opens the connection
            sent = [
                appends.append_now(
                    "t", {0: b"5"}, acks=Acks.LEADER, timeout_s=10, leader_epochs=None, done=done("5")
                ),
                appends.append_now(
                    "t",
                    {0: b"silent"},
                    acks=Acks.LEADER,
                    timeout_s=0.2,
                    leader_epochs=None,
                    done=done("silent"),
                ),
            ]
            await asyncio.sleep(0.3)  # past the silent one's timeout
            sent.append(
                appends.append_now(
                    "t",
                    {0: b"silent"},
                    acks=Acks.LEADER,
                    timeout_s=10,
                    leader_epochs={0: 3},
                    done=done("in-flight"),
                )
            )
            sent.append(
                appends.append_now(
                    "t", {0: b"drop"}, acks=Acks.LEADER, timeout_s=10, leader_epochs=None, done=done("drop")
                )
            )
            async with asyncio.timeout(10):
                await all_heard.wait()
            return before, sent, heard
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()

    before, sent, heard = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert before is False and "1" not in heard  # no connection yet: nothing sent
    assert sent == [True, True, True, True]
    assert all(len(answers) == 1 for answers in heard.values())  # each heard exactly once
    assert heard["5"][0][0].error is None and heard["5"][0][0].base_offset == 5
    assert heard["silent"][0][0].error.reason == "REQUEST_TIMED_OUT"
    # The unreadable answer failed every append in flight on the connection, retriably.
    for name in ("drop", "in-flight"):
        error = heard[name][0][0].error
        assert error is not None and error.reason == "NETWORK_EXCEPTION" and error.retriable


def test_append_now_deadlines_share_one_timer_and_each_times_out_at_its_own():
    """The callbacks' waits are bounded by one timer per connection: an append answered in time
    is not failed when the timer fires for an earlier one, a later one with a longer timeout
    times out at its own deadline (the timer is armed again), and one with a shorter timeout
    than the one armed for is not held to the longer."""

    def answer_bytes(number, request):
        return [] if bytes(request.partitions[0].records).startswith(b"silent") else [_answer(request)]

    async def scenario():
        handle, _connections = _node(answer_bytes)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        appends = NodeAppends("127.0.0.1", server.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        heard: dict[str, tuple[float, AppendResult]] = {}
        all_heard = asyncio.Event()
        started = loop.time()

        def done(name):
            def hear(results):
                assert name not in heard, "heard twice"
                heard[name] = (loop.time() - started, results[0])
                if len(heard) == 4:
                    all_heard.set()

            return hear

        try:
            await appends.append("t", {0: b"1"}, acks=Acks.LEADER, timeout_s=10)  # opens the connection
            started = loop.time()
            for name, timeout_s in (
                ("silent-long", 0.6),
                ("silent-short", 0.2),
                ("2", 0.2),
                ("silent-3", 1.0),
            ):
                payload = b"2" if name == "2" else name.encode()
                assert appends.append_now(
                    "t",
                    {0: payload},
                    acks=Acks.LEADER,
                    timeout_s=timeout_s,
                    leader_epochs=None,
                    done=done(name),
                )
            async with asyncio.timeout(10):
                await all_heard.wait()
            return heard
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()

    heard = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert heard["2"][1].error is None and heard["2"][1].base_offset == 2
    for name, timeout_s in (("silent-short", 0.2), ("silent-long", 0.6), ("silent-3", 1.0)):
        elapsed, result = heard[name]
        assert result.error is not None and result.error.reason == "REQUEST_TIMED_OUT", name
        assert timeout_s - 0.01 <= elapsed < timeout_s + 2, (name, elapsed)
    assert heard["silent-short"][0] < heard["silent-long"][0] < heard["silent-3"][0]


def test_a_timed_out_callback_that_raises_leaves_the_other_appends_to_time_out():
    """One timer serves a connection's waits: a callback that raises when its append times out
    (the loop's exception handler hears of it) does not leave the other appends past their
    deadline waiting forever."""

    def answer_bytes(number, request):
        return []  # the node never answers

    async def scenario():
        handle, _connections = _node(answer_bytes)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        appends = NodeAppends("127.0.0.1", server.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        raised: list[BaseException] = []
        loop.set_exception_handler(lambda _loop, context: raised.append(context.get("exception")))
        heard: dict[str, AppendResult] = {}
        both = asyncio.Event()

        def done(name):
            def hear(results):
                heard[name] = results[0]
                if len(heard) == 2:
                    both.set()
                if name == "raises":
                    raise RuntimeError("a broken callback")

            return hear

        try:
            # opens the connection (the node's silence times it out: that is fine here)
            await appends.append("t", {0: b"x"}, acks=Acks.LEADER, timeout_s=0.2)
            for name in ("raises", "other"):
                assert appends.append_now(
                    "t", {0: b"y"}, acks=Acks.LEADER, timeout_s=0.2, leader_epochs=None, done=done(name)
                )
            async with asyncio.timeout(10):
                await both.wait()
            return heard, raised
        finally:
            await appends.close()
            server.close()
            await server.wait_closed()

    heard, raised = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert heard["other"].error is not None and heard["other"].error.reason == "REQUEST_TIMED_OUT"
    assert any(isinstance(e, RuntimeError) for e in raised)
