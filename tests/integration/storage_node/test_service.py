"""The StorageNode gRPC service and fetch port against a real node process (no etcd)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import grpc
import pytest

from services import errors
from services.fetchport import multi, protocol
from services.fetchport.client import FetchClient
from services.proto import pb
from services.records import Compression, iter_batches

from .conftest import make_batch


def _values(batch_bytes):
    return [r.value for b in iter_batches(batch_bytes) for r in b.records()]


def test_append_then_fetch_round_trip(node):
    node.create("events")
    first = node.append("events", 0, make_batch([b"a", b"b", b"c"]))
    second = node.append("events", 0, make_batch([b"d", b"e"], compression=Compression.SNAPPY))
    assert not first.HasField("error") and not second.HasField("error")
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 4)
    result = node.fetch("events", 0, 0, max_bytes=1 << 20)
    assert result.header.error() is None
    assert result.header.high_watermark == 5 and result.header.log_start_offset == 0
    assert _values(result.records) == [b"a", b"b", b"c", b"d", b"e"]
    offsets = [r.offset for b in iter_batches(result.records) for r in b.records()]
    assert offsets == [0, 1, 2, 3, 4]
    # From the middle of the second batch: whole batches only, so it starts at the batch.
    tail = node.fetch("events", 0, 4)
    assert [r.offset for b in iter_batches(tail.records) for r in b.records()] == [3, 4]


def test_first_batch_is_returned_whole_even_above_max_bytes(node):
    node.create("big")
    node.append("big", 0, make_batch([b"x" * 5000]))
    node.append("big", 0, make_batch([b"y" * 10]))
    result = node.fetch("big", 0, 0, max_bytes=100)
    batches = list(iter_batches(result.records))
    assert len(batches) == 1 and batches[0].record_count == 1
    assert len(result.records) > 5000


def test_list_offsets_and_describe(node):
    node.create("t")
    node.append("t", 0, make_batch([b"1", b"2"], timestamp=1000))
    node.append("t", 0, make_batch([b"3"], timestamp=5000))
    queries = [
        pb.PartitionOffsetQuery(topic="t", partition=0, spec=spec)
        for spec in (
            pb.OffsetSpec(earliest=True),
            pb.OffsetSpec(latest=True),
            pb.OffsetSpec(timestamp=1001),
            pb.OffsetSpec(timestamp=4000),
            pb.OffsetSpec(timestamp=99999),
        )
    ]
    got = node.stub.ListPartitionOffsets(pb.ListPartitionOffsetsRequest(partitions=queries)).partitions
    assert [r.offset for r in got] == [0, 3, 1, 2, -1]
    assert got[3].timestamp == 5000
    info = node.describe("t")
    assert (info.log_start_offset, info.log_end_offset, info.high_watermark) == (0, 3, 3)
    assert info.size_bytes > 0 and info.segment_count == 1


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b[:-3], "CORRUPT_MESSAGE"),  # truncated
        (lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:], "CORRUPT_MESSAGE"),  # CRC-covered byte flipped
        (lambda b: b[:16] + b"\x01" + b[17:], "CORRUPT_MESSAGE"),  # wrong magic
        (lambda b: b"", None),  # empty
        (lambda b: b"garbage!" * 10, "CORRUPT_MESSAGE"),
    ],
)
def test_bad_batches_are_refused_and_nothing_is_written(node, mutate, reason):
    node.create("safe")
    node.append("safe", 0, make_batch([b"keep-1", b"keep-2"]))
    before = node.fetch("safe", 0, 0).records
    result = node.append("safe", 0, mutate(make_batch([b"bad"])))
    assert result.HasField("error")
    if reason:
        assert result.error.reason == reason
    assert node.describe("safe").log_end_offset == 2
    assert node.fetch("safe", 0, 0).records == before


def test_record_count_disagreeing_with_bytes_is_corrupt(node):
    import crc32c

    node.create("count")
    batch = bytearray(make_batch([b"a", b"b"]))
    struct.pack_into(">i", batch, 57, 3)  # recordCount says 3, the bytes hold 2
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))  # valid CRC over the lie
    result = node.append("count", 0, bytes(batch))
    assert result.error.reason == "CORRUPT_MESSAGE"
    assert node.describe("count").log_end_offset == 0


def test_oversized_batch_is_record_too_large(node):
    node.create("small", **{"max.message.bytes": "1000"})
    result = node.append("small", 0, make_batch([b"z" * 5000]))
    assert result.error.reason == "RECORD_TOO_LARGE"
    assert node.describe("small").log_end_offset == 0


def test_unknown_partition_and_bad_acks(node):
    result = node.append("nope", 3, make_batch([b"a"]))
    assert result.error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
    with pytest.raises(grpc.RpcError) as info:
        node.stub.Append(pb.AppendRequest(acks=17))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(errors.error_from_rpc(info.value), errors.InvalidRequiredAcksError)
    fetched = node.fetch("nope", 3, 0)
    assert isinstance(fetched.header.error(), errors.UnknownTopicOrPartitionError)


@pytest.mark.parametrize("topic", ["a/b", "..", "x" * 300, "sp ace"])
def test_create_partition_refuses_a_topic_name_the_disk_cannot_hold(node, topic):
    with pytest.raises(grpc.RpcError) as info:
        node.stub.CreatePartition(pb.CreatePartitionRequest(topic=topic, partition=0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(errors.error_from_rpc(info.value), errors.InvalidTopicError)
    node.create("still-serving")  # and the node goes on
    assert node.describe("still-serving").log_end_offset == 0


def test_create_partition_batch_answers_each_partition_on_its_own(node):
    node.create("batch-kept")
    node.append("batch-kept", 0, make_batch([b"kept"]))
    response = node.stub.CreatePartitionBatch(
        pb.CreatePartitionBatchRequest(
            partitions=[
                pb.CreatePartitionRequest(topic="batch-new", partition=p, configs={"retention.ms": "60000"})
                for p in range(3)
            ]
            + [
                pb.CreatePartitionRequest(topic="batch-kept", partition=0, must_exist=True),
                pb.CreatePartitionRequest(topic="batch-lost", partition=0, must_exist=True),
                pb.CreatePartitionRequest(topic="a/b", partition=0),
                pb.CreatePartitionRequest(topic="batch-bad", partition=0, configs={"retention.ms": "soon"}),
            ]
        )
    )
    outcomes = [
        (r.topic, r.partition, r.error.reason if r.HasField("error") else None) for r in response.partitions
    ]
    assert outcomes == [
        ("batch-new", 0, None),
        ("batch-new", 1, None),
        ("batch-new", 2, None),
        ("batch-kept", 0, None),
        ("batch-lost", 0, "REPLICA_NOT_AVAILABLE"),
        ("a/b", 0, "INVALID_TOPIC_EXCEPTION"),
        ("batch-bad", 0, "INVALID_CONFIG"),
    ]
    assert response.partitions[3].log_end_offset == 1  # confirmed, records kept
    assert all(node.describe("batch-new", p).log_end_offset == 0 for p in range(3))
    assert node.append("batch-new", 2, make_batch([b"x"])).base_offset == 0
    with pytest.raises(grpc.RpcError) as info:  # nothing made of the refused ones
        node.describe("batch-bad")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_offset_out_of_range_on_fetch(node):
    node.create("range")
    node.append("range", 0, make_batch([b"a", b"b"]))
    assert isinstance(node.fetch("range", 0, 3).header.error(), errors.OffsetOutOfRangeError)
    assert isinstance(node.fetch("range", 0, -1).header.error(), errors.OffsetOutOfRangeError)
    at_end = node.fetch("range", 0, 2)
    assert at_end.header.error() is None and at_end.records == b""


def test_delete_records_advances_log_start(node):
    node.create("dr", **{"segment.bytes": "200"})
    for i in range(10):
        node.append("dr", 0, make_batch([b"v%d" % i]))
    response = node.stub.DeleteRecords(
        pb.DeletePartitionRecordsRequest(topic="dr", partition=0, before_offset=6)
    )
    assert response.log_start_offset == 6
    assert isinstance(node.fetch("dr", 0, 2).header.error(), errors.OffsetOutOfRangeError)
    assert _values(node.fetch("dr", 0, 6).records)[0] == b"v6"


def test_long_poll_is_woken_by_an_append(node):
    node.create("poll")

    async def scenario():
        client = FetchClient("127.0.0.1", node.fetch_port)
        started = time.monotonic()
        waiter = asyncio.create_task(client.fetch("poll", 0, 0, min_bytes=1, max_wait_ms=5000))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(node.append, "poll", 0, make_batch([b"wake"]))
        result = await waiter
        elapsed = time.monotonic() - started
        empty_started = time.monotonic()
        empty = await client.fetch("poll", 0, 1, min_bytes=1, max_wait_ms=400)
        empty_elapsed = time.monotonic() - empty_started
        await client.close()
        return result, elapsed, empty, empty_elapsed

    result, elapsed, empty, empty_elapsed = asyncio.run(scenario())
    assert _values(result.records) == [b"wake"]
    assert elapsed < 3.0
    assert empty.records == b"" and 0.35 <= empty_elapsed < 3.0


def _raw_connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def _read_response(sock):
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            break
        body += chunk
    return protocol.decode_response_header(body[: protocol.response_prefix_length(body)], size)


def _closed_by_peer(sock) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed with our unread garbage still queued: a reset
        return True


def test_bad_fetch_clients_do_not_disturb_others(node):
    node.create("shared")
    node.append("shared", 0, make_batch([b"ok"]))
    # 1. garbage: an absurd frame size -> INVALID_REQUEST answer, then the connection closes
    garbage = _raw_connect(node.fetch_port)
    garbage.sendall(b"\x7f\xff\xff\xffGARBAGE")
    header = _read_response(garbage)
    assert header.error_code == errors.InvalidRequestError.kafka_code
    assert _closed_by_peer(garbage)
    # 2. a truncated frame followed by a close
    truncated = _raw_connect(node.fetch_port)
    frame = protocol.encode_request(protocol.FetchRequest(1, "shared", 0, 0, 1000))
    truncated.sendall(frame[:10])
    truncated.close()
    # 3. a staller: half a frame, then nothing
    staller = _raw_connect(node.fetch_port)
    staller.sendall(frame[:7])
    # 4. a well-formed body with inconsistent topic length
    liar = _raw_connect(node.fetch_port)
    body = bytearray(frame[4:])
    struct.pack_into(">h", body, 30, 200)
    liar.sendall(frame[:4] + bytes(body))
    assert _read_response(liar).error_code == errors.InvalidRequestError.kafka_code
    # a good client is served meanwhile, and the stored data is intact
    assert _values(node.fetch("shared", 0, 0).records) == [b"ok"]
    assert node.describe("shared").log_end_offset == 1
    staller.close()
    liar.close()
    garbage.close()


def test_many_concurrent_fetch_connections(node):
    node.create("fan")
    node.append("fan", 0, make_batch([b"r%d" % i for i in range(100)]))

    async def scenario():
        clients = [FetchClient("127.0.0.1", node.fetch_port, max_connections=1) for _ in range(200)]
        results = await asyncio.gather(*(c.fetch("fan", 0, 0) for c in clients))
        await asyncio.gather(*(c.close() for c in clients))
        return results

    results = asyncio.run(scenario())
    assert all(len(_values(r.records)) == 100 for r in results)


def test_describe_log_dirs_reports_traffic_totals(node):
    node.create("traffic")
    batch = make_batch([b"a" * 100, b"b" * 100])
    node.append("traffic", 0, batch)
    served = node.fetch("traffic", 0, 0).records
    response = node.stub.DescribeLogDirs(pb.DescribeLogDirsRequest())
    traffic = response.traffic
    assert (traffic.bytes_in, traffic.records_in, traffic.append_requests) == (len(batch), 2, 1)
    assert traffic.bytes_out == len(served) and traffic.fetch_requests == 1
    partitions = [p for d in response.log_dirs for p in d.partitions]
    assert [(p.topic, p.log_end_offset) for p in partitions] == [("traffic", 2)]


def test_a_sparse_fetch_leaves_out_partitions_with_nothing_new(node):
    """Fetch port version 3: only partitions with records, an error, or offsets other than the
    known ones are answered; the others are left out (found quiet at the high watermark, or
    past the answer's byte budget, without a read)."""
    for partition in range(4):
        node.create("sparse", partition)
    node.append("sparse", 0, make_batch([b"a", b"b", b"c"]))
    node.append("sparse", 1, make_batch([b"y" * 2000]))
    node.append("sparse", 2, make_batch([b"a", b"b", b"c"]))
    node.append("sparse", 3, make_batch([b"x" * 3000]))

    def known(partition: int, offset: int, high_watermark: int) -> multi.PartitionFetch:
        return multi.PartitionFetch("sparse", partition, offset, 1 << 20, -1, -1, high_watermark, 0)

    async def scenario():
        client = FetchClient("127.0.0.1", node.fetch_port)
        try:
            wide = await client.fetch_many_sparse(
                [
                    known(0, 3, 3),  # at the high watermark it knows: quiet
                    known(1, 0, 1),  # records to read (they spend the answer's budget)
                    known(2, 3, 2),  # a high watermark other than known
                    known(3, 0, 1),  # records, but past the budget, offsets as known: quiet
                    multi.PartitionFetch("sparse", 9, 0, 100, -1, -1, 0, 0),  # unknown partition
                ],
                max_bytes=100,
            )
            alone = await client.fetch_many_sparse([known(3, 0, 1)], max_bytes=100)
            return wide, alone
        finally:
            await client.close()

    wide, alone = asyncio.run(scenario())
    assert wide[0] is None and wide[3] is None
    assert wide[1] is not None and _values(wide[1].records) == [b"y" * 2000]
    assert wide[2] is not None and wide[2].records == b"" and wide[2].header.high_watermark == 3
    assert wide[4] is not None and isinstance(wide[4].header.error(), errors.UnknownTopicOrPartitionError)
    # alone, its first batch goes whole
    assert alone[0] is not None and _values(alone[0].records) == [b"x" * 3000]
