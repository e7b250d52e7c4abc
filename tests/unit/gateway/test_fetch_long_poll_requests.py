"""A fetch whose partitions take one fetch-port request sends it as the long poll itself: one
round trip to the node, not a read without waiting followed by the long poll (fake nodes: each
records the fetch-port requests it serves)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from services.proto import pb


def _fetch(offset: int, **settings) -> pb.FetchRequest:
    return pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=offset)], **settings)


def test_a_fetch_that_finds_nothing_waits_in_its_first_node_request(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        node = cluster.nodes[0]

        async def produce_later():
            await asyncio.sleep(0.3)
            await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(value=b"late")]))

        producer = asyncio.create_task(produce_later())
        started = time.monotonic()
        answer = await stub.Fetch(_fetch(0, min_bytes=1, max_wait_ms=5000))
        waited = time.monotonic() - started
        await producer
        assert [r.value for r in answer.partitions[0].records] == [b"late"]
        assert 0.25 < waited < 2.0  # woken by the append, not at max_wait
        assert len(node.fetch_requests) == 1, node.fetch_requests
        assert node.fetch_requests[0].max_wait_ms > 4000  # the long poll, from the first request

    run_with_cluster(scenario, nodes=1)


def test_a_fetch_with_data_or_min_bytes_zero_is_answered_at_once(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        node = cluster.nodes[0]
        await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(value=b"here")]))
        started = time.monotonic()
        answer = await stub.Fetch(_fetch(0, min_bytes=1, max_wait_ms=5000))
        assert [r.value for r in answer.partitions[0].records] == [b"here"]
        # min_bytes 0: whatever there is (nothing past the end), without waiting
        empty = await stub.Fetch(_fetch(1, min_bytes=0, max_wait_ms=5000))
        assert time.monotonic() - started < 2.0
        assert len(empty.partitions[0].records) == 0 and not empty.partitions[0].HasField("error")
        assert len(node.fetch_requests) == 2  # one each
        assert node.fetch_requests[1].max_wait_ms == 0

    run_with_cluster(scenario, nodes=1)


def test_a_long_poll_that_finds_nothing_takes_one_node_request(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        node = cluster.nodes[0]
        started = time.monotonic()
        answer = await cluster.stub().Fetch(_fetch(0, min_bytes=1, max_wait_ms=300))
        assert 0.25 < time.monotonic() - started < 2.0
        assert len(answer.partitions[0].records) == 0 and not answer.partitions[0].HasField("error")
        # not a second request for what was left of the deadline when the node's wait ended
        assert len(node.fetch_requests) == 1, node.fetch_requests

    run_with_cluster(scenario, nodes=1)


def test_a_node_that_ends_its_wait_early_ends_the_long_poll(run_with_cluster):
    """A node caps long polls (its fetch.max.wait.ms) below what the gateway allows: its empty
    answer ends the fetch, as a long poll that brought nothing always did, instead of the
    gateway polling again for the rest of the client's wait."""

    async def scenario(cluster):
        cluster.create_topic("t", 1)
        node = cluster.nodes[0]
        answer_within_cap = node._answer

        async def capped(request):
            return await answer_within_cap(
                dataclasses.replace(request, max_wait_ms=min(request.max_wait_ms, 200))
            )

        node._answer = capped
        started = time.monotonic()
        answer = await cluster.stub().Fetch(_fetch(0, min_bytes=1, max_wait_ms=3000))
        assert 0.15 < time.monotonic() - started < 1.5
        assert len(answer.partitions[0].records) == 0 and not answer.partitions[0].HasField("error")
        assert len(node.fetch_requests) == 1, node.fetch_requests

    run_with_cluster(scenario, nodes=1)
