"""Committed offsets against real processes: commits with metadata and per-partition errors,
standalone commits, DescribeGroup's lag, reset and delete (refused while members are active),
and a sustained 1,000 commits/s."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from services import errors
from services.proto import coordinator_grpc, pb
from tests.support.names import unique
from tests.support.wait import CLUSTER_ERRORS, wait_until

from ._members import SimMember, call, converged
from .conftest import all_partitions


@pytest.fixture
def members():
    started: list[SimMember] = []
    yield started
    for member in started:
        member.stop()


def member_group(
    cluster, members, topic: str, partitions: int, count: int = 1
) -> tuple[str, list[SimMember]]:
    group = unique("g")
    stub = cluster.stub()
    ms = [SimMember(stub, group, topics=[topic], session_ms=3000, name=f"m{i}").start() for i in range(count)]
    members.extend(ms)
    wait_until(
        lambda: converged(ms, all_partitions(topic, partitions)),
        timeout=10,
        what="members converged",
        tolerate=CLUSTER_ERRORS,
    )
    return group, ms


def produce(cluster, topic: str, partition: int, count: int, first_timestamp: int = 1_000_000) -> None:
    records = [
        pb.ProduceRecord(value=b"v%d" % i, partition=partition, timestamp=first_timestamp + 1000 * i)
        for i in range(count)
    ]
    call(cluster.gateway_stub().Produce, pb.ProduceRequest(topic=topic, records=records), timeout=30)


def fetch(cluster, group: str, *tps) -> dict[tuple[str, int], int]:
    request = pb.FetchCommittedOffsetsRequest(
        group_id=group, partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in tps]
    )
    return {
        (o.topic, o.partition): o.offset for o in call(cluster.stub().FetchCommittedOffsets, request).offsets
    }


def test_commit_and_fetch_with_metadata_and_per_partition_errors(cluster, members):
    topic = cluster.create_topic(unique("commit"), 2)
    group, (member,) = member_group(cluster, members, topic, 2)
    request = pb.CommitOffsetsRequest(
        group_id=group,
        member_id=member.member_id,
        generation_id=member.generation,
        offsets=[
            pb.OffsetCommit(topic=topic, partition=0, offset=42, metadata="m0"),
            pb.OffsetCommit(topic=topic, partition=9, offset=1),
            pb.OffsetCommit(topic=topic, partition=1, offset=7, metadata="x" * 5000),
        ],
    )
    results = {r.partition: r.error.reason for r in call(cluster.stub().CommitOffsets, request).results}
    assert results == {0: "", 9: "UNKNOWN_TOPIC_OR_PARTITION", 1: "OFFSET_METADATA_TOO_LARGE"}
    fetched = call(
        cluster.stub(cluster.standby_id()).FetchCommittedOffsets,
        pb.FetchCommittedOffsetsRequest(group_id=group),
    ).offsets
    assert [(o.partition, o.offset, o.metadata) for o in fetched] == [(0, 42, "m0")]
    assert fetched[0].commit_timestamp > 1_600_000_000_000
    assert fetch(cluster, group, (topic, 0), (topic, 1)) == {(topic, 0): 42, (topic, 1): -1}


def test_standalone_commits_only_while_the_group_has_no_members(cluster, members):
    topic = cluster.create_topic(unique("standalone"), 1)
    group = unique("g")
    standalone = pb.CommitOffsetsRequest(
        group_id=group,
        member_id="",
        generation_id=-1,
        offsets=[pb.OffsetCommit(topic=topic, partition=0, offset=3)],
    )
    assert not call(cluster.stub().CommitOffsets, standalone).results[0].HasField("error")
    assert fetch(cluster, group, (topic, 0)) == {(topic, 0): 3}
    member = SimMember(cluster.stub(), group, topics=[topic], session_ms=3000).start()
    members.append(member)
    with pytest.raises(errors.UnknownMemberIdError):
        call(cluster.stub().CommitOffsets, standalone)


def test_describe_group_shows_members_assignment_offsets_and_lag(cluster, members):
    topic = cluster.create_topic(unique("lag"), 2)
    produce(cluster, topic, 0, 10)
    produce(cluster, topic, 1, 5)
    group, (member,) = member_group(cluster, members, topic, 2)
    member.commit({(topic, 0): 4})
    described = call(
        cluster.stub(cluster.standby_id()).DescribeGroup, pb.DescribeGroupRequest(group_id=group)
    )
    assert described.state == "Stable" and described.generation_id == member.generation
    assert described.assignor == pb.ASSIGNOR_COOPERATIVE_STICKY
    (only,) = described.members
    assert only.member_id == member.member_id and only.client_id == "m0" and only.host
    assert {(a.topic, a.partition) for a in only.assignment} == all_partitions(topic, 2)
    assert {(a.topic, a.partition) for a in only.owned} == all_partitions(topic, 2)
    lags = {p.partition: (p.committed_offset, p.log_end_offset, p.lag, p.owner) for p in described.partitions}
    assert lags == {0: (4, 10, 6, member.member_id), 1: (-1, 5, 5, member.member_id)}
    listed = {g.group_id: g for g in call(cluster.stub().ListGroups, pb.ListGroupsRequest()).groups}
    assert listed[group].state == "Stable" and listed[group].member_count == 1


def test_reset_and_delete_refused_while_active_then_done_when_empty(cluster, members):
    topic = cluster.create_topic(unique("reset"), 2)
    produce(cluster, topic, 0, 10)
    produce(cluster, topic, 1, 5)
    group, (member,) = member_group(cluster, members, topic, 2)
    member.commit({(topic, 0): 2, (topic, 1): 2})
    stub = cluster.stub()

    def reset(**kwargs):
        request = pb.ResetGroupOffsetsRequest(group_id=group, topics=[topic], **kwargs)
        return {(o.topic, o.partition): o.offset for o in call(stub.ResetGroupOffsets, request).offsets}

    with pytest.raises(errors.NonEmptyGroupError):
        reset(spec=pb.OffsetSpec(earliest=True))
    with pytest.raises(errors.NonEmptyGroupError):
        call(stub.DeleteGroup, pb.DeleteGroupRequest(group_id=group))
    member.leave()

    assert reset(spec=pb.OffsetSpec(latest=True), dry_run=True) == {(topic, 0): 10, (topic, 1): 5}
    assert fetch(cluster, group, (topic, 0), (topic, 1)) == {(topic, 0): 2, (topic, 1): 2}, (
        "dry run changed nothing"
    )
    assert reset(spec=pb.OffsetSpec(earliest=True)) == {(topic, 0): 0, (topic, 1): 0}
    assert reset(spec=pb.OffsetSpec(timestamp=1_004_500)) == {(topic, 0): 5, (topic, 1): 5}
    assert reset(explicit=[pb.OffsetCommit(topic=topic, partition=0, offset=3)]) == {(topic, 0): 3}
    assert fetch(cluster, group, (topic, 0), (topic, 1)) == {(topic, 0): 3, (topic, 1): 5}

    call(stub.DeleteGroup, pb.DeleteGroupRequest(group_id=group))
    assert fetch(cluster, group, (topic, 0)) == {(topic, 0): -1}
    assert group not in {g.group_id for g in call(stub.ListGroups, pb.ListGroupsRequest()).groups}
    with pytest.raises(errors.GroupIdNotFoundError):
        call(stub.DescribeGroup, pb.DescribeGroupRequest(group_id=group))
    with pytest.raises(errors.GroupIdNotFoundError):
        call(stub.DeleteGroup, pb.DeleteGroupRequest(group_id=group))


RATE = 1000
SECONDS = 3.0
WORKERS = 16


def test_sustains_a_thousand_commits_per_second(cluster, members):
    topic = cluster.create_topic(unique("rate"), 8)
    group, ms = member_group(cluster, members, topic, 8, count=4)
    address = cluster.address(cluster.active_id())

    async def drive() -> tuple[int, list, float]:
        failures: list = []
        done = 0
        async with grpc.aio.insecure_channel(address) as channel:
            stub = coordinator_grpc.CoordinatorStub(channel)
            start = time.monotonic()

            async def worker(index: int) -> None:
                nonlocal done
                member = ms[index % len(ms)]
                n = 0
                while True:
                    due = start + (index + n * WORKERS) / RATE
                    if due - start >= SECONDS:
                        return
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    member_id, generation, owned, _ = member.snapshot()
                    request = pb.CommitOffsetsRequest(
                        group_id=group,
                        member_id=member_id,
                        generation_id=generation,
                        offsets=[pb.OffsetCommit(topic=t, partition=p, offset=n) for t, p in sorted(owned)],
                    )
                    try:
                        response = await stub.CommitOffsets(request, timeout=10)
                        failures.extend(r.error for r in response.results if r.HasField("error"))
                    except grpc.aio.AioRpcError as exc:
                        failures.append(exc)
                    done += 1
                    n += 1

            await asyncio.gather(*(worker(i) for i in range(WORKERS)))
            return done, failures, time.monotonic() - start

    done, failures, elapsed = asyncio.run(drive())
    assert failures == []
    assert done == int(RATE * SECONDS) and elapsed < SECONDS + 1.0, (done, elapsed)
