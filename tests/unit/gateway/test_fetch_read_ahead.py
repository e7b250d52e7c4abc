"""A fetch session's next read, started as its answer is written (``gateway/server/fetch_ahead.py``):
which fetch it serves and when it is dropped, against a scripted fetch handler."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateway.server.fetch import FetchCommand, FetchedPartition, NewsRead, PartitionFetch
from gateway.server.fetch_ahead import ReadAhead
from gateway.server.fetch_sessions import FetchSession
from services import errors

COMMAND = FetchCommand(
    partitions=(PartitionFetch("t", 0, 5, 1024, 5, 0),), min_bytes=1, max_wait_ms=500, raw_batches=True
)


def _result(next_offset: int) -> FetchedPartition:
    return FetchedPartition("t", 0, None, next_offset, 0, next_offset, [], b"x" * (next_offset - 5))


class ScriptedHandler:
    """``read_news`` answers with what the test puts in ``reads`` (one future per call);
    ``fetch_news`` (a fresh read) with ``fresh`` at once. Both record the commands."""

    def __init__(self) -> None:
        self.reads: list[asyncio.Future[NewsRead]] = []
        self.read_commands: list[FetchCommand] = []
        self.fresh_commands: list[FetchCommand] = []
        self.fresh = [_result(9)]

    async def read_news(self, command: FetchCommand) -> NewsRead:
        self.read_commands.append(command)
        future: asyncio.Future[NewsRead] = asyncio.get_running_loop().create_future()
        self.reads.append(future)
        return await future

    async def fetch_news(self, command: FetchCommand) -> list[FetchedPartition | None]:
        self.fresh_commands.append(command)
        return list(self.fresh)


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 10))


async def settled() -> None:
    """A few loop turns: a read whose future was just resolved has ended (its task's step and
    its done callbacks ran)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _started(ahead: ReadAhead, handler: ScriptedHandler, session: FetchSession, tasks: set) -> None:
    ahead.start(handler, session, COMMAND, tasks)
    await asyncio.sleep(0)  # the read's first step: it is waiting now
    assert len(handler.reads) == 1


def test_a_read_still_waiting_serves_the_fetch_that_asks_the_same_whatever_it_brings():
    async def scenario():
        handler, ahead, tasks, session = ScriptedHandler(), ReadAhead(), set(), FetchSession(1)
        await _started(ahead, handler, session, tasks)
        fetch = asyncio.ensure_future(ahead.fetch_news(handler, session, COMMAND))
        await asyncio.sleep(0.01)
        assert not fetch.done()  # waits for the read, not a read of its own
        handler.reads[0].set_result(NewsRead([None], satisfied=False))  # its wait ran out: nothing
        assert await fetch == [None]
        assert handler.fresh_commands == [] and (ahead.used, ahead.dropped) == (1, 0)
        assert not tasks  # the read's task left the connection's set as it ended

    run(scenario)


def test_a_read_done_with_news_is_answered_at_once():
    async def scenario():
        handler, ahead, session = ScriptedHandler(), ReadAhead(), FetchSession(1)
        await _started(ahead, handler, session, set())
        handler.reads[0].set_result(NewsRead([_result(7)], satisfied=True))
        await settled()
        assert await ahead.fetch_news(handler, session, COMMAND) == [_result(7)]
        assert handler.fresh_commands == []
        # taken: the next fetch reads afresh
        assert await ahead.fetch_news(handler, session, COMMAND) == [_result(9)]

    run(scenario)


def test_a_read_done_without_news_or_too_long_ago_is_dropped_for_a_fresh_one():
    async def scenario():
        handler, ahead, session = ScriptedHandler(), ReadAhead(), FetchSession(1)
        await _started(ahead, handler, session, set())
        handler.reads[0].set_result(NewsRead([None], satisfied=False))
        await settled()
        assert await ahead.fetch_news(handler, session, COMMAND) == [_result(9)]
        assert handler.fresh_commands[-1].max_wait_ms == COMMAND.max_wait_ms  # the fetch's whole wait

        short = dataclasses.replace(COMMAND, max_wait_ms=20)
        ahead.start(handler, session, short, set())
        await asyncio.sleep(0)
        handler.reads[1].set_result(NewsRead([_result(7)], satisfied=True))
        await asyncio.sleep(0.1)  # news older than the fetch's max_wait: not served
        assert await ahead.fetch_news(handler, session, short) == [_result(9)]
        assert (ahead.used, ahead.dropped) == (0, 2)

    run(scenario)


def test_a_fetch_asking_something_else_cancels_the_read():
    async def scenario():
        handler, ahead, session = ScriptedHandler(), ReadAhead(), FetchSession(1)
        await _started(ahead, handler, session, set())
        moved = dataclasses.replace(COMMAND, partitions=(PartitionFetch("t", 0, 2, 1024, -1, -1),))
        assert await ahead.fetch_news(handler, session, moved) == [_result(9)]
        assert handler.fresh_commands == [moved]
        assert handler.reads[0].cancelled() and ahead.dropped == 1

    run(scenario)


def test_sessions_sharing_a_connection_do_not_cancel_each_other():
    async def scenario():
        handler, ahead, tasks = ScriptedHandler(), ReadAhead(), set()
        first, second = FetchSession(1), FetchSession(2)
        await _started(ahead, handler, first, tasks)
        # the other session's fetch reads afresh; its answer does not replace the running read
        assert await ahead.fetch_news(handler, second, COMMAND) == [_result(9)]
        ahead.start(handler, second, COMMAND, tasks)
        await asyncio.sleep(0)
        assert len(handler.reads) == 1 and not handler.reads[0].done()
        handler.reads[0].set_result(NewsRead([_result(6)], satisfied=True))
        assert await ahead.fetch_news(handler, first, COMMAND) == [_result(6)]
        # a closed session's read gives way to another session's
        ahead.start(handler, first, COMMAND, tasks)
        await asyncio.sleep(0)
        first.closed = True
        ahead.start(handler, second, COMMAND, tasks)
        await asyncio.sleep(0)
        assert handler.reads[1].cancelled() and len(handler.reads) == 3

    run(scenario)


def test_a_failed_read_is_replaced_by_a_fresh_one_and_a_cancelled_fetch_cancels_its_read():
    async def scenario():
        handler, ahead, session = ScriptedHandler(), ReadAhead(), FetchSession(1)
        await _started(ahead, handler, session, set())
        handler.reads[0].set_exception(errors.BrokerNotAvailableError("gone"))
        await settled()
        assert await ahead.fetch_news(handler, session, COMMAND) == [_result(9)]

        ahead.start(handler, session, COMMAND, set())
        await asyncio.sleep(0)
        fetch = asyncio.ensure_future(ahead.fetch_news(handler, session, COMMAND))
        await asyncio.sleep(0)
        fetch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        await asyncio.sleep(0)
        assert handler.reads[1].cancelled()

    run(scenario)


def test_only_long_polls_are_read_ahead():
    assert ReadAhead.wanted(COMMAND)
    assert not ReadAhead.wanted(dataclasses.replace(COMMAND, min_bytes=0))
    assert not ReadAhead.wanted(dataclasses.replace(COMMAND, max_wait_ms=0))


# ---- through the gateway's data listener (fake storage node, the SDK's consumer) ---------------


def _consumer(cluster):
    from gateway.client import AsyncConsumer

    return AsyncConsumer(servers=f"127.0.0.1:{cluster.gateway.port}", fetch_max_wait_ms=5000)


async def _poll_until(consumer, tp, got: list, count: int) -> None:
    while len(got) < count:
        polled = await consumer.poll(timeout_ms=5000)
        got += [r.value for r in polled.get(tp, [])]


def test_a_consumers_next_fetch_is_served_by_the_read_its_last_answer_started(run_with_cluster):
    from gateway.client import TopicPartition
    from services.proto import pb

    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        tp = TopicPartition("t", 0)
        async with _consumer(cluster) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[bytes] = []
            for n in range(4):
                await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(value=b"r%d" % n)]))
                await _poll_until(consumer, tp, got, n + 1)
            assert got == [b"r0", b"r1", b"r2", b"r3"]
            (connection,) = cluster.gateway.data_listener._connections
            ahead = connection.read_ahead
            # every answer but the last started the next read, which the next fetch took
            assert ahead.used >= 3, (ahead.started, ahead.used, ahead.dropped)
            # one node request per answer: a fetch served by a read ahead sends none of its own
            offsets = [r.offset for r in cluster.nodes[0].fetch_requests]
            assert offsets == sorted(set(offsets)), offsets

    run_with_cluster(scenario, nodes=1)


def test_a_seek_mid_session_reads_from_the_new_position(run_with_cluster):
    from gateway.client import TopicPartition
    from services.proto import pb

    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        tp = TopicPartition("t", 0)
        for value in (b"a", b"b"):
            await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(value=value)]))
        async with _consumer(cluster) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[bytes] = []
            await _poll_until(consumer, tp, got, 2)
            consumer.seek(tp, 1)  # the read started at offset 2 is not what is asked now
            await _poll_until(consumer, tp, got, 3)
            await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(value=b"c")]))
            await _poll_until(consumer, tp, got, 4)
            assert got == [b"a", b"b", b"b", b"c"]

    run_with_cluster(scenario, nodes=1)
