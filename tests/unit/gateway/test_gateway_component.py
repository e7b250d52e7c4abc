"""The gateway process logic against in-process fakes (see conftest.py): fast and deterministic.

The same behaviours run against real coordinator and storage node processes in
``tests/integration/gateway``.
"""

import asyncio
import time

import grpc
import pytest

from services import errors
from services.partitioner import partition_for_key
from services.proto import pb
from services.records import RecordBatchBuilder, iter_batches
from tests.support.wait import async_wait_until


def typed(value: bytes, key: bytes | None = None, partition: int | None = None, headers=(), timestamp=None):
    record = pb.ProduceRecord(value=value, headers=[pb.Header(key=k, value=v) for k, v in headers])
    if key is not None:
        record.key = key
    if partition is not None:
        record.partition = partition
    if timestamp is not None:
        record.timestamp = timestamp
    return record


def raw_batch(*values: bytes) -> bytes:
    builder = RecordBatchBuilder()
    for v in values:
        builder.append(v, timestamp=1)
    return builder.build()


async def fetch_all(stub, topic, partitions, **kwargs):
    request = pb.FetchRequest(
        partitions=[pb.FetchPartition(topic=topic, partition=p, offset=0) for p in partitions], **kwargs
    )
    return await stub.Fetch(request)


async def wait_for_gateway_to_know(cluster, topic):
    await async_wait_until(
        lambda: topic in cluster.gateway.router.snapshot.topics,
        timeout=2.0,
        what=f"the gateway seeing {topic}",
    )


def test_typed_produce_and_fetch_round_trip(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 8)
        stub = cluster.stub()
        records = [
            typed(
                f"v{i}".encode(),
                key=f"k{i}".encode(),
                headers=[("h", str(i).encode()), ("n", None)],
                timestamp=1000 + i,
            )
            for i in range(40)
        ]
        response = await stub.Produce(
            pb.ProduceRequest(topic="t", records=records, compression=pb.COMPRESSION_LZ4)
        )
        assert [r.partition for r in response.records] == [
            partition_for_key(f"k{i}".encode(), 8) for i in range(40)
        ]
        assert all(not p.HasField("error") for p in response.partitions)
        fetched = await fetch_all(stub, "t", range(8))
        by_value = {}
        for part in fetched.partitions:
            assert not part.HasField("error")
            assert part.next_offset == part.high_watermark == len(part.records)
            assert [r.offset for r in part.records] == list(range(len(part.records)))
            for r in part.records:
                by_value[r.value] = (part.partition, r)
        for i, result in enumerate(response.records):
            partition, r = by_value[f"v{i}".encode()]
            assert (partition, r.offset) == (result.partition, result.offset)
            assert (r.key, r.timestamp, r.timestamp_type) == (
                f"k{i}".encode(),
                1000 + i,
                pb.TIMESTAMP_TYPE_CREATE_TIME,
            )
            assert [(h.key, h.value if h.HasField("value") else None) for h in r.headers] == [
                ("h", str(i).encode()),
                ("n", None),
            ]

    run_with_cluster(scenario)


def test_null_keys_and_values_and_default_timestamp(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 3)
        stub = cluster.stub()
        before = int(time.time() * 1000)
        response = await stub.Produce(pb.ProduceRequest(topic="t", records=[pb.ProduceRecord(), typed(b"x")]))
        assert len({r.partition for r in response.records}) == 1  # sticky for null keys
        part = (await fetch_all(stub, "t", [response.records[0].partition])).partitions[0]
        assert not part.records[0].HasField("key") and not part.records[0].HasField("value")
        assert before <= part.records[0].timestamp <= int(time.time() * 1000)

    run_with_cluster(scenario)


def test_raw_batches_pass_through(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        blob = raw_batch(b"a", b"b") + raw_batch(b"c")
        response = await stub.Produce(
            pb.ProduceRequest(topic="t", batches=[pb.PartitionBatches(partition=1, record_batches=blob)])
        )
        assert [(p.partition, p.base_offset, p.record_count) for p in response.partitions] == [(1, 0, 3)]
        assert len(response.records) == 0
        fetched = (await fetch_all(stub, "t", [1], raw_batches=True)).partitions[0]
        assert len(fetched.records) == 0 and fetched.next_offset == 3
        # Identical bytes apart from the base offsets the node assigned (outside the CRC).
        got = [bytes(b.buffer[12:]) for b in iter_batches(fetched.record_batches)]
        sent = [bytes(b.buffer[12:]) for b in iter_batches(blob)]
        assert got == sent
        assert [b.base_offset for b in iter_batches(fetched.record_batches)] == [0, 2]

    run_with_cluster(scenario)


def test_long_poll_returns_when_data_lands_and_times_out_empty(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 4)
        stub = cluster.stub()
        request = pb.FetchRequest(
            partitions=[pb.FetchPartition(topic="t", partition=p, offset=0) for p in range(4)],
            min_bytes=1,
            max_wait_ms=2000,
        )
        start = time.monotonic()
        empty = await stub.Fetch(request)
        waited = time.monotonic() - start
        assert 1.9 <= waited < 2.6
        assert all(len(p.records) == 0 and not p.HasField("error") for p in empty.partitions)

        async def produce_later():
            await asyncio.sleep(0.3)
            await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"late", partition=2)]))

        producer = asyncio.create_task(produce_later())
        start = time.monotonic()
        answer = await stub.Fetch(request)
        waited = time.monotonic() - start
        await producer
        assert 0.25 < waited < 1.0
        assert [r.value for r in answer.partitions[2].records] == [b"late"]

    run_with_cluster(scenario)


def test_long_poll_ends_before_the_calls_own_deadline(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        request = pb.FetchRequest(
            partitions=[pb.FetchPartition(topic="t", partition=0, offset=0)], min_bytes=1, max_wait_ms=10_000
        )
        start = time.monotonic()
        answer = await cluster.stub().Fetch(request, timeout=1.0)  # not DEADLINE_EXCEEDED
        assert 0.5 < time.monotonic() - start < 1.0
        assert len(answer.partitions[0].records) == 0 and not answer.partitions[0].HasField("error")

    run_with_cluster(scenario)


def test_min_bytes_gathers_across_partitions(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        request = pb.FetchRequest(
            partitions=[pb.FetchPartition(topic="t", partition=p, offset=0) for p in range(2)],
            min_bytes=300,
            max_wait_ms=3000,
        )

        async def trickle():
            for i in range(4):
                await asyncio.sleep(0.1)
                await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(bytes(60), partition=i % 2)]))

        producer = asyncio.create_task(trickle())
        start = time.monotonic()
        answer = await stub.Fetch(request)
        waited = time.monotonic() - start
        await producer
        total = sum(len(p.records) for p in answer.partitions)
        assert waited < 2.0  # answered once ~300 bytes were there, not at max_wait
        assert total >= 3

    run_with_cluster(scenario)


def test_fetch_byte_budgets(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        for p in range(2):
            for _ in range(5):
                await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(bytes(500), partition=p)] * 2))
        # Per partition: one batch (~1.1 KB) fits 1500 bytes, the second does not.
        request = pb.FetchRequest(
            partitions=[
                pb.FetchPartition(topic="t", partition=p, offset=0, max_bytes=1500) for p in range(2)
            ],
            raw_batches=True,
        )
        answer = await stub.Fetch(request)
        assert [len(list(iter_batches(p.record_batches))) for p in answer.partitions] == [1, 1]
        assert [p.next_offset for p in answer.partitions] == [2, 2]
        # A budget smaller than one batch still returns that batch whole.
        request.partitions[0].max_bytes = 10
        request.max_bytes = 10
        answer = await stub.Fetch(request)
        assert [len(list(iter_batches(p.record_batches))) for p in answer.partitions] == [1, 0]
        assert [p.next_offset for p in answer.partitions] == [2, 0]

    run_with_cluster(scenario)


def test_fetch_from_the_middle_skips_earlier_records(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(str(i).encode()) for i in range(10)]))
        answer = await stub.Fetch(
            pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=6)])
        )
        assert [r.offset for r in answer.partitions[0].records] == [6, 7, 8, 9]
        raw = await stub.Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic="t", partition=0, offset=6)], raw_batches=True
            )
        )
        assert [b.base_offset for b in iter_batches(raw.partitions[0].record_batches)] == [0]  # whole batch

    run_with_cluster(scenario)


def rpc_reason(exc: grpc.aio.AioRpcError) -> str:
    return errors.error_from_rpc(exc).reason


def test_request_errors(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        cases = [
            (
                pb.ProduceRequest(topic="nope", records=[typed(b"x")]),
                grpc.StatusCode.NOT_FOUND,
                "UNKNOWN_TOPIC_OR_PARTITION",
            ),
            (
                pb.ProduceRequest(topic="", records=[typed(b"x")]),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_TOPIC_EXCEPTION",
            ),
            (
                pb.ProduceRequest(topic="t", records=[typed(b"x")], batches=[pb.PartitionBatches()]),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
            ),
            (
                pb.ProduceRequest(topic="t", records=[typed(b"x")], acks=9),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUIRED_ACKS",
            ),
            (
                pb.ProduceRequest(topic="t", records=[typed(b"x", partition=-3)]),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
            ),
        ]
        for request, code, reason in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Produce(request)
            assert (info.value.code(), rpc_reason(info.value)) == (code, reason), request

    run_with_cluster(scenario)


@pytest.mark.parametrize("level, message", [(7, "unknown isolation_level 7")], ids=["unknown"])
def test_fetch_isolation_levels_not_served_are_refused(run_with_cluster, level, message):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        for raw in (False, True):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await fetch_all(stub, "t", [0], isolation_level=level, raw_batches=raw)
            assert (info.value.code(), rpc_reason(info.value)) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
            )
            assert message in info.value.details()
        # (READ_COMMITTED needs a node's version-1 fetch frames: tested with real nodes in
        # tests/integration/transactions.)
        for served in (pb.ISOLATION_LEVEL_UNSPECIFIED, pb.ISOLATION_LEVEL_READ_UNCOMMITTED):
            answer = await fetch_all(stub, "t", [0], isolation_level=served)
            assert not answer.partitions[0].HasField("error")

    run_with_cluster(scenario)


def test_per_partition_errors_do_not_fail_the_rest(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        cluster.create_topic("small", 2, {"max.message.bytes": "1000"})
        stub = cluster.stub()
        response = await stub.Produce(
            pb.ProduceRequest(topic="t", records=[typed(b"ok", partition=0), typed(b"bad", partition=5)])
        )
        by_partition = {p.partition: p for p in response.partitions}
        assert not by_partition[0].HasField("error")
        assert by_partition[5].error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
        assert [(r.partition, r.offset) for r in response.records] == [(0, 0), (5, -1)]

        response = await stub.Produce(
            pb.ProduceRequest(
                topic="small", records=[typed(bytes(5000), partition=0), typed(b"fine", partition=1)]
            )
        )
        errors_by_partition = {p.partition: p.error.reason for p in response.partitions}
        assert errors_by_partition == {0: "RECORD_TOO_LARGE", 1: ""}
        # Many small records still fit: the gateway splits batches at the topic's max.message.bytes.
        response = await stub.Produce(
            pb.ProduceRequest(topic="small", records=[typed(bytes(200), partition=0)] * 30)
        )
        assert not response.partitions[0].HasField("error") and response.records[-1].offset == 29

        bad = bytearray(raw_batch(b"x"))
        bad[-1] ^= 1
        response = await stub.Produce(
            pb.ProduceRequest(
                topic="t",
                batches=[
                    pb.PartitionBatches(partition=0, record_batches=bytes(bad)),
                    pb.PartitionBatches(partition=1, record_batches=raw_batch(b"y")),
                ],
            )
        )
        assert [p.error.reason for p in response.partitions] == ["CORRUPT_MESSAGE", ""]

        fetched = await stub.Fetch(
            pb.FetchRequest(
                partitions=[
                    pb.FetchPartition(topic="t", partition=0, offset=99),
                    pb.FetchPartition(topic="t", partition=1, offset=0),
                    pb.FetchPartition(topic="nope", partition=0, offset=0),
                    pb.FetchPartition(topic="t", partition=7),
                ]
            )
        )
        assert [p.error.reason for p in fetched.partitions] == [
            "OFFSET_OUT_OF_RANGE",
            "",
            "UNKNOWN_TOPIC_OR_PARTITION",
            "UNKNOWN_TOPIC_OR_PARTITION",
        ]
        assert [r.value for r in fetched.partitions[1].records] == [b"y"]

    run_with_cluster(scenario)


def test_produce_stream_pipelines_and_answers_in_order(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 4)
        for node in cluster.nodes.values():
            node.append_delay = 0.05  # slow appends: requests pile up behind each one
        stub = cluster.stub()
        requests = [
            pb.ProduceRequest(
                topic="t", correlation_id=1000 + i, records=[typed(str(i).encode(), partition=i % 4)]
            )
            for i in range(100)
        ]
        requests.insert(50, pb.ProduceRequest(topic="missing", correlation_id=-5, records=[typed(b"x")]))
        answers = [a async for a in stub.ProduceStream(iter(requests))]
        assert [a.correlation_id for a in answers] == [r.correlation_id for r in requests]
        # Pipelined and coalesced: what queued behind an append in flight went out merged.
        appends = sum(node.append_calls for node in cluster.nodes.values())
        assert 4 <= appends <= 20
        failed = answers[50]
        assert failed.partitions[0].partition == -1
        assert failed.partitions[0].error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
        ok = [a for a in answers if a.correlation_id >= 1000]
        assert [a.records[0].offset for a in ok if a.records[0].partition == 0] == list(range(25))

    run_with_cluster(scenario)


def _open_stream(stub):
    """A ProduceStream fed from a queue: ``(call, queue)``; put requests, None to end writing."""
    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (request := await queue.get()) is not None:
            yield request

    return stub.ProduceStream(requests()), queue


def test_an_idle_produce_stream_is_ended_with_a_retriable_status(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        call, queue = _open_stream(cluster.stub())
        await queue.put(pb.ProduceRequest(topic="t", correlation_id=1, records=[typed(b"a")]))
        assert (await call.read()).correlation_id == 1
        answered = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        idle = time.monotonic() - answered
        assert 0.25 <= idle < 2.0
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        error = errors.error_from_rpc(info.value)
        assert isinstance(error, errors.NetworkError) and error.retriable
        assert "idle for" in error.message and "produce_stream_max_idle_ms=300" in error.message
        # A new stream works at once.
        answers = [
            a
            async for a in cluster.stub().ProduceStream(
                iter([pb.ProduceRequest(topic="t", records=[typed(b"b")])])
            )
        ]
        assert answers[0].records[0].offset == 1

    run_with_cluster(scenario, produce_stream_max_idle_ms=300)


def test_a_stream_owed_an_answer_is_not_idle(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        for node in cluster.nodes.values():
            node.append_delay = 1.0  # the answer takes over three idle periods
        call, queue = _open_stream(cluster.stub())
        await queue.put(pb.ProduceRequest(topic="t", correlation_id=7, records=[typed(b"slow")]))
        answer = await call.read()
        assert answer.correlation_id == 7 and answer.records[0].offset == 0
        await queue.put(pb.ProduceRequest(topic="t", correlation_id=8, records=[typed(b"next")]))
        assert (await call.read()).correlation_id == 8  # the stream was kept
        await queue.put(None)
        assert await call.read() is grpc.aio.EOF

    run_with_cluster(scenario, produce_stream_max_idle_ms=300)


def test_acks_none_answers_without_offsets_and_still_writes(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        stub = cluster.stub()
        response = await stub.Produce(
            pb.ProduceRequest(topic="t", acks=pb.ACKS_NONE, records=[typed(b"x")] * 3)
        )
        assert [r.offset for r in response.records] == [-1, -1, -1]
        assert response.partitions[0].base_offset == -1
        for _ in range(100):
            if cluster.nodes[0].logs[("t", 0)].next_offset == 3:
                break
            await asyncio.sleep(0.01)
        assert cluster.nodes[0].logs[("t", 0)].next_offset == 3

    run_with_cluster(scenario)


def test_stale_metadata_is_refreshed_and_retried(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"before", partition=0)]))
        # The leader moves and the watch does not say so; only GetMetadata knows.
        cluster.move_leader("t", 0, 1, publish=False)
        cluster.revision += 1
        calls = cluster.metadata_calls
        response = await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"after", partition=0)]))
        assert not response.partitions[0].HasField("error") and response.records[0].offset == 1
        assert cluster.metadata_calls > calls
        fetched = await fetch_all(stub, "t", [0])
        assert [r.value for r in fetched.partitions[0].records] == [b"before", b"after"]

    run_with_cluster(scenario)


def test_restarted_node_on_new_ports(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        await stub.Produce(
            pb.ProduceRequest(topic="t", records=[typed(b"a", partition=0), typed(b"b", partition=1)])
        )
        await fetch_all(stub, "t", [0, 1])  # open fetch connections to both nodes
        cluster.hidden_nodes.add(0)  # the node's registration lapses...
        cluster.bump()
        await cluster.restart_node(0)  # ...it comes back elsewhere...

        async def reregister():
            await asyncio.sleep(0.3)
            cluster.hidden_nodes.discard(0)
            cluster.bump()

        task = asyncio.create_task(reregister())  # ...and registers again a little later
        response = await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"c", partition=0)]))
        await task
        assert not response.partitions[0].HasField("error") and response.records[0].offset == 1
        fetched = await fetch_all(stub, "t", [0, 1])
        assert [[r.value for r in p.records] for p in fetched.partitions] == [[b"a", b"c"], [b"b"]]

    run_with_cluster(scenario)


def test_produce_gives_up_at_its_deadline(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 1)
        cluster.topics["t"].leaders[0] = -1  # offline
        cluster.bump()
        await async_wait_until(
            lambda: cluster.gateway.router.snapshot.revision >= cluster.revision,
            what="the gateway seeing the partition offline",
        )
        stub = cluster.stub()
        start = time.monotonic()
        response = await stub.Produce(pb.ProduceRequest(topic="t", timeout_ms=600, records=[typed(b"x")]))
        assert 0.4 < time.monotonic() - start < 1.5
        assert response.partitions[0].error.reason == "LEADER_NOT_AVAILABLE"
        assert response.partitions[0].error.retriable

    run_with_cluster(scenario)


def test_list_offsets(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        cluster.create_topic("u", 1)
        stub = cluster.stub()
        await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"x", partition=1)] * 3))
        answer = await stub.ListOffsets(
            pb.ListOffsetsRequest(
                partitions=[
                    pb.ListOffsetsPartition(topic="t", partition=1, spec=pb.OffsetSpec(latest=True)),
                    pb.ListOffsetsPartition(topic="t", partition=0, spec=pb.OffsetSpec(earliest=True)),
                    pb.ListOffsetsPartition(topic="t", partition=9, spec=pb.OffsetSpec(latest=True)),
                    pb.ListOffsetsPartition(topic="u", partition=0),
                    pb.ListOffsetsPartition(topic="nope", partition=0, spec=pb.OffsetSpec(latest=True)),
                ]
            )
        )
        assert [(p.offset, p.error.reason) for p in answer.partitions] == [
            (3, ""),
            (0, ""),
            (-1, "UNKNOWN_TOPIC_OR_PARTITION"),
            (-1, "INVALID_REQUEST"),
            (-1, "UNKNOWN_TOPIC_OR_PARTITION"),
        ]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListOffsets(
                pb.ListOffsetsRequest(
                    partitions=[
                        pb.ListOffsetsPartition(topic="t", partition=0, spec=pb.OffsetSpec(latest=True))
                    ]
                    * 2
                )
            )
        assert rpc_reason(info.value) == "INVALID_REQUEST"

    run_with_cluster(scenario)


def test_list_offsets_bad_spec_fails_only_its_partition(run_with_cluster):
    async def scenario(cluster):
        cluster.create_topic("t", 2)
        stub = cluster.stub()
        answer = await stub.ListOffsets(
            pb.ListOffsetsRequest(
                partitions=[
                    pb.ListOffsetsPartition(topic="t", partition=0, spec=pb.OffsetSpec(timestamp=-5)),
                    pb.ListOffsetsPartition(topic="t", partition=1, spec=pb.OffsetSpec(earliest=True)),
                ]
            )
        )
        assert [(p.partition, p.offset, p.error.reason) for p in answer.partitions] == [
            (0, -1, "INVALID_REQUEST"),
            (1, 0, ""),
        ]
        assert "negative" in answer.partitions[0].error.message

    run_with_cluster(scenario)


def test_metadata_falls_back_to_polling_without_watch(run_with_cluster):
    async def scenario(cluster):
        stub = cluster.stub()
        for _ in range(100):
            if cluster.gateway.router.cache.mode == "poll":
                break
            await asyncio.sleep(0.01)
        assert cluster.gateway.router.cache.mode == "poll"
        cluster.create_topic("later", 1)
        await wait_for_gateway_to_know(cluster, "later")
        metadata = await stub.GetMetadata(pb.GetMetadataRequest())
        assert [t.name for t in metadata.topics] == ["later"]

    def run(cluster_scenario):
        async def wrapped(cluster):
            cluster.watch_supported = False
            await cluster.gateway.router.cache.stop()
            cluster.gateway.router.cache.start()
            await cluster_scenario(cluster)

        return wrapped

    run_with_cluster(run(scenario), metadata_poll_interval_ms=100)


def test_admin_calls_are_forwarded_with_errors_intact(run_with_cluster):
    async def scenario(cluster):
        stub = cluster.stub()
        created = await stub.CreateTopic(pb.CreateTopicRequest(name="new", partitions=3))
        assert len(created.topic.partitions) == 3
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateTopic(pb.CreateTopicRequest(name="new", partitions=3))
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert rpc_reason(info.value) == "TOPIC_ALREADY_EXISTS"
        # Not implemented by this (fake) coordinator: the status comes through.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.DeleteTopic(pb.DeleteTopicRequest(name="new"))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # The gateway can produce to a topic it has just created.
        response = await stub.Produce(pb.ProduceRequest(topic="new", records=[typed(b"x", partition=2)]))
        assert response.records[0].offset == 0

    run_with_cluster(scenario)


def test_not_controller_redirect_is_followed(run_with_cluster):
    async def scenario(cluster):
        stub = cluster.stub()
        cluster.create_topic("a", 1)
        # This coordinator says "not me" and names itself -> no loop; names another -> followed.
        cluster.not_controller_redirect = "127.0.0.1:1"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListTopics(pb.ListTopicsRequest(), timeout=3)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        cluster.not_controller_redirect = None
        assert list((await stub.ListTopics(pb.ListTopicsRequest())).names) == ["a"]

    run_with_cluster(scenario, admin_timeout_ms=1000)


def test_fails_over_from_a_dead_coordinator(run_with_cluster):
    async def scenario(cluster):
        stub = cluster.stub()
        cluster.create_topic("t", 1)
        await wait_for_gateway_to_know(cluster, "t")  # the watch found the live coordinator
        assert list((await stub.ListTopics(pb.ListTopicsRequest())).names) == ["t"]
        response = await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"x")]))
        assert response.records[0].offset == 0

    run_with_cluster(scenario, dead_coordinators=["127.0.0.1:1"])


def test_metadata_and_data_survive_a_coordinator_outage(run_with_cluster):
    async def scenario(cluster):
        stub = cluster.stub()
        cluster.create_topic("t", 2)
        await wait_for_gateway_to_know(cluster, "t")
        await cluster.coordinator.server.stop(0)  # every coordinator gone
        metadata = await stub.GetMetadata(pb.GetMetadataRequest(topics=["t", "nope"]))
        assert [t.name for t in metadata.topics] == ["t", "nope"]
        assert metadata.topics[1].error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
        # The data plane runs on the cached routes.
        response = await stub.Produce(pb.ProduceRequest(topic="t", records=[typed(b"x", partition=1)]))
        assert response.records[0].offset == 0
        fetched = await fetch_all(stub, "t", [1])
        assert [r.value for r in fetched.partitions[0].records] == [b"x"]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListTopics(pb.ListTopicsRequest(), timeout=5)
        assert rpc_reason(info.value) in ("COORDINATOR_NOT_AVAILABLE", "REQUEST_TIMED_OUT")

    run_with_cluster(scenario, admin_timeout_ms=500)
