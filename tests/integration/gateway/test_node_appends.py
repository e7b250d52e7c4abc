"""The gateway's pipelined append connection (``gateway/server/node_appends.py``) against real
storage node processes: answers at every acks level, fencing, order of many appends in flight,
what a killed node's in-flight appends read as, reconnection, and the gRPC fallback for a node
whose port takes no appends."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.server import storage_calls
from gateway.server.node_appends import NodeAppends
from services import errors
from services.acks import Acks
from services.proto import pb, storage_grpc
from storage_node.fetch.server import FetchServer
from storage_node.notifier import AppendNotifier
from tests.integration.storage_node.conftest import make_batch, start_node
from tests.support.ports import free_port
from tests.support.wait import wait_until


@pytest.fixture
def fixed_node(tmp_path):
    """A standalone node on fixed ports, so that a restart comes back at the same address."""
    handle = start_node(tmp_path, "node", "--port", str(free_port()), "--fetch-port", str(free_port()))
    yield handle
    handle.close()
    handle.process.stop()


def _run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("acks", [Acks.NONE, Acks.LEADER, Acks.ALL])
def test_appends_over_the_data_port_are_answered_with_offsets(fixed_node, acks):
    fixed_node.create("a", 0)
    fixed_node.create("a", 1)

    async def go():
        appends = NodeAppends("127.0.0.1", fixed_node.fetch_port)
        try:
            first = await appends.append(
                "a", {0: make_batch([b"x", b"y"]), 1: make_batch([b"z"])}, acks=acks, timeout_s=5
            )
            second = await appends.append("a", {0: make_batch([b"w"])}, acks=acks, timeout_s=5)
        finally:
            await appends.close()
        return first, second

    first, second = _run(go())
    assert first is not None and second is not None
    assert (first[0].base_offset, first[0].last_offset, first[0].record_count) == (0, 1, 2)
    assert (first[1].base_offset, second[0].base_offset) == (0, 2)
    assert all(r.error is None for r in [*first.values(), *second.values()])


def test_a_stale_leader_epoch_is_fenced(fixed_node):
    fixed_node.stub.CreatePartition(pb.CreatePartitionRequest(topic="f", partition=0, leader_epoch=5))

    async def go():
        appends = NodeAppends("127.0.0.1", fixed_node.fetch_port)
        try:
            return await appends.append(
                "f", {0: make_batch([b"x"])}, acks=Acks.LEADER, timeout_s=5, leader_epochs={0: 4}
            )
        finally:
            await appends.close()

    result = _run(go())
    assert result is not None
    assert isinstance(result[0].error, errors.FencedLeaderEpochError)
    assert fixed_node.describe("f").log_end_offset == 0


def test_many_appends_in_flight_land_in_call_order(fixed_node):
    fixed_node.create("o")
    count = 500

    async def go():
        appends = NodeAppends("127.0.0.1", fixed_node.fetch_port)
        try:
            calls = [
                appends.append(
                    "o",
                    {0: make_batch([b"%d" % i])},
                    acks=Acks.ALL if i % 3 == 0 else Acks.LEADER,
                    timeout_s=10,
                )
                for i in range(count)
            ]
            return await asyncio.gather(*calls)
        finally:
            await appends.close()

    answers = _run(go())
    assert [a[0].base_offset for a in answers] == list(range(count))
    assert all(a[0].error is None for a in answers)


def test_a_killed_node_fails_appends_in_flight_as_retriable_and_the_connection_comes_back(fixed_node):
    fixed_node.create("k")

    async def go():
        appends = NodeAppends("127.0.0.1", fixed_node.fetch_port)
        try:
            assert (await appends.append("k", {0: make_batch([b"a"])}, acks=Acks.LEADER, timeout_s=5))[
                0
            ].error is None
            fixed_node.process.kill()
            lost = await appends.append("k", {0: make_batch([b"lost?"])}, acks=Acks.LEADER, timeout_s=5)
            assert lost is not None and lost[0].error is not None and lost[0].error.retriable
            await asyncio.to_thread(fixed_node.restart)

            async def appended():
                again = await appends.append("k", {0: make_batch([b"b"])}, acks=Acks.LEADER, timeout_s=2)
                return again is not None and again[0].error is None and again[0]

            result = None
            for _ in range(100):  # bounded: the node is back within seconds
                result = await appended()
                if result:
                    break
                await asyncio.sleep(0.05)
            return result
        finally:
            await appends.close()

    result = _run(go())
    assert result, "appends resumed on a new connection after the node restarted"
    assert result.base_offset == 1  # the write before the kill was acknowledged, so it survived


def test_in_flight_appends_fail_retriably_when_the_node_dies_mid_stream(fixed_node):
    fixed_node.create("mid", 0, **{"min.insync.replicas": "1"})

    async def go():
        appends = NodeAppends("127.0.0.1", fixed_node.fetch_port)
        try:
            first = await appends.append("mid", {0: make_batch([b"first"])}, acks=Acks.LEADER, timeout_s=5)
            assert first is not None and first[0].error is None  # the connection is up
            batch = make_batch([b"v" * 1000] * 50)
            tasks = [
                asyncio.create_task(appends.append("mid", {0: batch}, acks=Acks.ALL, timeout_s=10))
                for _ in range(1500)
            ]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)  # answers are flowing
            fixed_node.process.kill()
            return await asyncio.gather(*tasks)
        finally:
            await appends.close()

    answers = _run(go())
    failed = [a[0].error for a in answers if a[0].error is not None]
    assert failed, "some appends were still in flight at the kill"
    assert all(e.retriable for e in failed), {type(e).__name__ for e in failed}
    acknowledged = sorted(a[0].last_offset for a in answers if a[0].error is None)
    fixed_node.restart()
    end = fixed_node.describe("mid").log_end_offset
    assert not acknowledged or acknowledged[-1] < end  # acknowledged records survived the kill


def test_a_port_without_appends_falls_back_to_grpc(fixed_node):
    """An older node's port refuses version 2: the same call goes over gRPC and still lands."""
    fixed_node.create("g")

    async def go():
        old_port = FetchServer(reader=None, notifier=AppendNotifier())
        port = await old_port.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fixed_node.process.info['grpc_port']}")
        appends = NodeAppends("127.0.0.1", port)
        try:
            assert await appends.append("g", {0: b""}, acks=Acks.LEADER, timeout_s=5) is None
            assert not appends.usable
            return await storage_calls.append(
                storage_grpc.StorageNodeStub(channel),
                "g",
                {0: make_batch([b"via grpc"])},
                acks=Acks.ALL,
                timeout_s=5,
                data_port=appends,
            )
        finally:
            await appends.close()
            await channel.close()
            await old_port.stop()

    result = _run(go())
    assert result[0].error is None and result[0].base_offset == 0
    wait_until(lambda: fixed_node.describe("g").high_watermark == 1, timeout=5, what="the append landed")
