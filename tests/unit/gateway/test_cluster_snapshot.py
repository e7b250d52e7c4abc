import pytest

from gateway.server.admin_forwarder import cached_metadata
from gateway.server.cluster_snapshot import DEFAULT_MAX_MESSAGE_BYTES, ClusterSnapshot
from services import errors
from services.broker_address import BrokerAddress
from services.proto import pb
from services.serde import error_to_proto


def metadata(revision=5):
    return pb.GetMetadataResponse(
        revision=revision,
        brokers=[
            pb.BrokerInfo(node_id=0, host="h0", grpc_port=100, fetch_port=200),
            pb.BrokerInfo(node_id=1, host="h1", grpc_port=101, fetch_port=201),
        ],
        topics=[
            pb.TopicMetadata(
                name="t",
                configs={"max.message.bytes": "2000"},
                partitions=[
                    pb.PartitionMetadata(partition=1, leader=1, state=pb.PARTITION_STATE_ONLINE),
                    pb.PartitionMetadata(partition=0, leader=0, state=pb.PARTITION_STATE_ONLINE),
                    pb.PartitionMetadata(partition=2, leader=-1, state=pb.PARTITION_STATE_PENDING),
                    pb.PartitionMetadata(partition=3, leader=7, state=pb.PARTITION_STATE_ONLINE),
                    pb.PartitionMetadata(partition=4, leader=0, state=pb.PARTITION_STATE_OFFLINE),
                ],
            ),
            pb.TopicMetadata(name="plain", partitions=[pb.PartitionMetadata(partition=0, leader=1)]),
            pb.TopicMetadata(name="gone", error=error_to_proto(errors.UnknownTopicOrPartitionError("x"))),
        ],
    )


def test_leader_lookup():
    snapshot = ClusterSnapshot.from_proto(metadata())
    assert snapshot.revision == 5
    assert snapshot.ensure_leader("t", 0) == BrokerAddress(0, "h0", 100, 200)
    assert snapshot.ensure_leader("t", 1).grpc_target == "h1:101"
    assert snapshot.topics["t"].partition_count == 5


@pytest.mark.parametrize(
    "topic, partition, error",
    [
        ("nope", 0, errors.UnknownTopicOrPartitionError),
        ("gone", 0, errors.UnknownTopicOrPartitionError),
        ("t", 5, errors.UnknownTopicOrPartitionError),
        ("t", 2, errors.LeaderNotAvailableError),  # pending: no leader yet
        ("t", 3, errors.BrokerNotAvailableError),  # leader is not a live node
        ("t", 4, errors.LeaderNotAvailableError),  # offline
    ],
)
def test_lookup_errors_are_retriable_metadata_errors(topic, partition, error):
    snapshot = ClusterSnapshot.from_proto(metadata())
    with pytest.raises(error) as info:
        snapshot.ensure_leader(topic, partition)
    assert info.value.retriable and info.value.invalid_metadata


def test_max_message_bytes_from_topic_configs():
    snapshot = ClusterSnapshot.from_proto(metadata())
    assert snapshot.topics["t"].max_message_bytes == 2000
    assert snapshot.topics["plain"].max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES


def test_cached_metadata_filters_and_flags_unknown_topics():
    source = metadata()
    assert cached_metadata(source, []) is source
    answer = cached_metadata(source, ["plain", "missing"])
    assert [t.name for t in answer.topics] == ["plain", "missing"]
    assert answer.topics[1].error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
    assert len(answer.brokers) == 2 and answer.revision == 5


def test_a_delta_replaces_changed_topics_and_drops_removed_ones():
    base = ClusterSnapshot.from_proto(metadata(revision=5))
    delta = pb.GetMetadataResponse(
        revision=9,
        is_delta=True,
        base_revision=5,
        brokers=[pb.BrokerInfo(node_id=1, host="h1", grpc_port=101, fetch_port=201)],
        topics=[
            pb.TopicMetadata(
                name="plain", partitions=[pb.PartitionMetadata(partition=0, leader=1, leader_epoch=3)]
            ),
            pb.TopicMetadata(name="new", partitions=[pb.PartitionMetadata(partition=0, leader=1)]),
        ],
        removed_topics=["t"],
    )
    snapshot = base.with_delta(delta)
    assert snapshot.revision == 9 and set(snapshot.nodes) == {1}
    assert set(snapshot.topics) == {"plain", "new"}
    assert snapshot.topics["plain"].partitions[0].leader_epoch == 3
    assert base.topics["plain"].partitions[0].leader_epoch == 0  # the old snapshot is untouched
    full = snapshot.source  # rebuilt whole for GetMetadata fallbacks
    assert not full.is_delta and not full.removed_topics and full.revision == 9
    assert [t.name for t in full.topics] == ["new", "plain"]
    assert [b.node_id for b in full.brokers] == [1]


def test_a_whole_snapshot_serves_its_own_response():
    response = metadata()
    assert ClusterSnapshot.from_proto(response).source is response


def test_the_watch_applies_deltas_in_order_and_refuses_a_gap():
    from gateway.server.routing import MetadataGapError, MetadataWatch

    watch = MetadataWatch(coordinators=None)  # apply() never calls the coordinators
    assert watch.apply(metadata(revision=5))
    step = pb.GetMetadataResponse(revision=7, is_delta=True, base_revision=5, removed_topics=["plain"])
    assert watch.apply(step)
    assert set(watch.snapshot.topics) == {"t"} and watch.snapshot.revision == 7
    stale = pb.GetMetadataResponse(revision=6, is_delta=True, base_revision=5, removed_topics=["t"])
    assert not watch.apply(stale) and "t" in watch.snapshot.topics
    with pytest.raises(MetadataGapError):
        watch.apply(pb.GetMetadataResponse(revision=12, is_delta=True, base_revision=9))


def test_a_partition_delta_replaces_only_the_changed_partitions():
    whole = pb.GetMetadataResponse(
        revision=5,
        brokers=[pb.BrokerInfo(node_id=0, host="h0", grpc_port=100, fetch_port=200)],
        topics=[
            pb.TopicMetadata(
                name="big",
                configs={"max.message.bytes": "2000"},
                partitions=[
                    pb.PartitionMetadata(partition=p, leader=0, state=pb.PARTITION_STATE_ONLINE)
                    for p in range(4)
                ],
            )
        ],
    )
    base = ClusterSnapshot.from_proto(whole)
    delta = pb.GetMetadataResponse(
        revision=8,
        is_delta=True,
        base_revision=5,
        brokers=whole.brokers,
        topics=[
            pb.TopicMetadata(
                name="big",
                partial=True,
                partitions=[pb.PartitionMetadata(partition=2, leader=-1, state=pb.PARTITION_STATE_OFFLINE)],
            )
        ],
    )
    snapshot = base.with_delta(delta)
    route = snapshot.topics["big"]
    assert route.partition_count == 4 and route.max_message_bytes == 2000  # the rest as it was
    assert [p.error is None for p in route.partitions] == [True, True, False, True]
    assert base.topics["big"].partitions[2].error is None  # the old snapshot is untouched
    served = snapshot.source.topics[0]
    assert [p.leader for p in served.partitions] == [0, 0, -1, 0] and not served.partial
    assert dict(served.configs) == {"max.message.bytes": "2000"}


def test_a_partition_delta_that_does_not_fit_makes_the_watch_start_over():
    from gateway.server.cluster_snapshot import PartialTopicError
    from gateway.server.routing import MetadataGapError, MetadataWatch

    base = ClusterSnapshot.from_proto(metadata(revision=5))
    unknown = pb.TopicMetadata(name="nope", partial=True, partitions=[pb.PartitionMetadata(partition=0)])
    beyond = pb.TopicMetadata(name="plain", partial=True, partitions=[pb.PartitionMetadata(partition=5)])
    for topic in (unknown, beyond):
        delta = pb.GetMetadataResponse(revision=6, is_delta=True, base_revision=5, topics=[topic])
        with pytest.raises(PartialTopicError):
            base.with_delta(delta)
        watch = MetadataWatch(coordinators=None)
        watch.apply(metadata(revision=5))
        with pytest.raises(MetadataGapError):
            watch.apply(delta)
