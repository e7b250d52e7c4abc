"""Topic admin, placement, metadata and standby forwarding on a real, healthy cluster.

Everything is asserted through the Coordinator gRPC API (plus the storage nodes' own
DescribePartitions, to check they really hold -- or no longer hold -- the data).
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest

from coordinator.redirect import CONTROLLER_TRAILER, FORWARDED_HEADER
from services import errors
from services.proto import pb
from tests.support.names import unique

from ._cluster import SHARED_RACKS, call, partitions_by_state, rpc_code, topic_of

# ---------------------------------------------------------------------------------------------
# Bad input: each a clear error with its reason.
# ---------------------------------------------------------------------------------------------

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
BAD_CREATES = [
    pytest.param(dict(name="", partitions=1), errors.InvalidTopicError, "can't be empty", id="empty-name"),
    pytest.param(dict(name=".", partitions=1), errors.InvalidTopicError, "cannot be", id="dot"),
    pytest.param(dict(name="..", partitions=1), errors.InvalidTopicError, "cannot be", id="dot-dot"),
    pytest.param(
        dict(name="x" * 250, partitions=1), errors.InvalidTopicError, "longer than 249", id="250-chars"
    ),
    pytest.param(dict(name="a/b", partitions=1), errors.InvalidTopicError, "'/'", id="slash"),
    pytest.param(dict(name="a b", partitions=1), errors.InvalidTopicError, "' '", id="space"),
    pytest.param(dict(name="caf\u00e9", partitions=1), errors.InvalidTopicError, "ASCII", id="non-ascii"),
    pytest.param(
        dict(name="ok-zero", partitions=0),
        errors.InvalidPartitionsError,
        "larger than 0",
        id="zero-partitions",
    ),
    pytest.param(
        dict(name="ok-neg", partitions=-4), errors.InvalidPartitionsError, "got -4", id="negative-partitions"
    ),
    pytest.param(
        dict(name="ok-rf", partitions=1, replication_factor=4),
        errors.InvalidReplicationFactorError,
        "larger than available brokers: 3",
        id="rf-above-live-nodes",
    ),
    pytest.param(
        dict(name="ok-rfneg", partitions=1, replication_factor=-1),
        errors.InvalidReplicationFactorError,
        "larger than 0",
        id="rf-negative",
    ),
    pytest.param(
        dict(name="ok-cfg", partitions=1, configs={"no.such.config": "1"}),
        errors.InvalidConfigError,
        "Unknown topic config name: no.such.config",
        id="unknown-config",
    ),
    pytest.param(
        dict(name="ok-val", partitions=1, configs={"retention.ms": "soon"}),
        errors.InvalidConfigError,
        "Invalid value 'soon' for configuration retention.ms",
        id="bad-config-value",
    ),
    pytest.param(
        dict(name="ok-min", partitions=1, configs={"segment.bytes": "1"}),
        errors.InvalidConfigError,
        "value must be between 14 and 2147483647",
        id="config-below-minimum",
    ),
    pytest.param(
        dict(name="ok-choice", partitions=1, configs={"cleanup.policy": "shred"}),
        errors.InvalidConfigError,
        "must be one of",
        id="config-not-a-choice",
    ),
]


@pytest.mark.parametrize(("fields", "error", "fragment"), BAD_CREATES)
def test_bad_create_topic_is_refused_with_its_reason(shared_cluster, fields, error, fragment):
    with pytest.raises(error) as info:
        call(shared_cluster.stub().CreateTopic, pb.CreateTopicRequest(**fields))
    assert rpc_code(info.value) == INVALID_ARGUMENT
    assert fragment in info.value.message
    names = call(shared_cluster.stub().ListTopics, pb.ListTopicsRequest()).names
    assert fields["name"] not in names


def test_creating_an_existing_topic_and_deleting_a_missing_one(shared_cluster):
    stub = shared_cluster.stub()
    name = unique("exists")
    call(stub.CreateTopic, pb.CreateTopicRequest(name=name, partitions=2))
    with pytest.raises(errors.TopicAlreadyExistsError, match=f"Topic '{name}' already exists") as info:
        call(stub.CreateTopic, pb.CreateTopicRequest(name=name, partitions=5))
    assert rpc_code(info.value) == grpc.StatusCode.ALREADY_EXISTS
    assert len(topic_of(shared_cluster.metadata(topics=[name]), name).partitions) == 2  # untouched

    missing = unique("missing")
    with pytest.raises(
        errors.UnknownTopicOrPartitionError, match=f"Topic '{missing}' does not exist"
    ) as info:
        call(stub.DeleteTopic, pb.DeleteTopicRequest(name=missing))
    assert rpc_code(info.value) == grpc.StatusCode.NOT_FOUND


def test_names_differing_only_by_dot_and_underscore_collide(shared_cluster):
    stub = shared_cluster.stub()
    base = unique("metrics").replace("-", "_")
    call(stub.CreateTopic, pb.CreateTopicRequest(name=f"{base}_a", partitions=1))
    with pytest.raises(errors.InvalidTopicError, match="collides with existing topic"):
        call(stub.CreateTopic, pb.CreateTopicRequest(name=f"{base}.a", partitions=1))


def test_bad_partition_and_config_changes_are_refused(shared_cluster):
    stub = shared_cluster.stub()
    name = unique("alter")
    call(stub.CreateTopic, pb.CreateTopicRequest(name=name, partitions=3))
    with pytest.raises(errors.InvalidPartitionsError, match="already has 3"):
        call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic=name, total_count=3))
    with pytest.raises(errors.InvalidPartitionsError, match="not be an increase"):
        call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic=name, total_count=2))
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic=unique("nope"), total_count=9))
    with pytest.raises(errors.InvalidConfigError, match="Unknown topic config name: bogus"):
        call(stub.AlterTopicConfigs, pb.AlterTopicConfigsRequest(topic=name, set={"bogus": "1"}))
    with pytest.raises(errors.InvalidConfigError, match=r"retention\.bytes"):
        call(stub.AlterTopicConfigs, pb.AlterTopicConfigsRequest(topic=name, set={"retention.bytes": "-7"}))
    with pytest.raises(errors.InvalidConfigError, match="Unknown topic config name: bogus"):
        call(stub.AlterTopicConfigs, pb.AlterTopicConfigsRequest(topic=name, delete=["bogus"]))
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        call(
            stub.AlterTopicConfigs,
            pb.AlterTopicConfigsRequest(topic=unique("nope"), set={"retention.ms": "1"}),
        )
    described = call(stub.DescribeTopics, pb.DescribeTopicsRequest(names=[name])).topics[0]
    assert len(described.metadata.partitions) == 3 and list(described.configs) == []


# ---------------------------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------------------------


def test_twelve_partitions_on_three_nodes_give_four_leaders_each(shared_cluster):
    name = unique("twelve")
    topic = call(shared_cluster.stub().CreateTopic, pb.CreateTopicRequest(name=name, partitions=12)).topic
    assert partitions_by_state(topic) == {"PARTITION_STATE_ONLINE": list(range(12))}
    assert Counter(p.leader for p in topic.partitions) == {1: 4, 2: 4, 3: 4}
    # Online means the leader really holds it.
    for node_id in SHARED_RACKS:
        held = {p for t, p in shared_cluster.local_partitions(node_id) if t == name}
        assert held == {p.partition for p in topic.partitions if p.leader == node_id}


def test_replicas_on_distinct_nodes_and_racks(shared_cluster):
    name = unique("racks")
    topic = call(
        shared_cluster.stub().CreateTopic,
        pb.CreateTopicRequest(name=name, partitions=8, replication_factor=2),
    ).topic
    assert topic.replication_factor == 2
    for p in topic.partitions:
        assert len(set(p.replicas)) == 2
        assert {SHARED_RACKS[r] for r in p.replicas} == {"r1", "r2"}, "one replica per rack"
        assert p.leader == p.replicas[0] and list(p.in_sync_replicas) == list(p.replicas)
    # Replicas (not only leaders) are created on their nodes.
    for node_id in SHARED_RACKS:
        held = {p for t, p in shared_cluster.local_partitions(node_id) if t == name}
        assert held == {p.partition for p in topic.partitions if node_id in p.replicas}


# ---------------------------------------------------------------------------------------------
# Lifecycle
# ---------------------------------------------------------------------------------------------


def test_topic_lifecycle_create_describe_grow_alter_delete(shared_cluster):
    stub = shared_cluster.stub()
    name = unique("life")
    revision0 = shared_cluster.metadata().revision

    validated = call(
        stub.CreateTopic, pb.CreateTopicRequest(name=name, partitions=2, validate_only=True)
    ).topic
    assert len(validated.partitions) == 2 and name not in call(stub.ListTopics, pb.ListTopicsRequest()).names

    created = call(
        stub.CreateTopic,
        pb.CreateTopicRequest(
            name=name, partitions=2, configs={"retention.ms": "60000", "cleanup.policy": "delete"}
        ),
    ).topic
    assert dict(created.configs) == {"retention.ms": "60000", "cleanup.policy": "delete"}
    assert name in call(stub.ListTopics, pb.ListTopicsRequest()).names
    metadata = shared_cluster.metadata(topics=[name])
    assert metadata.revision > revision0 and metadata.controller_id and metadata.cluster_id

    described = call(
        stub.DescribeTopics, pb.DescribeTopicsRequest(names=[name], include_defaults=True)
    ).topics[0]
    configs = {c.name: c for c in described.configs}
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["segment.bytes"].is_default and configs["segment.bytes"].documentation

    grown = call(stub.CreatePartitions, pb.CreatePartitionsRequest(topic=name, total_count=5)).topic
    assert partitions_by_state(grown) == {"PARTITION_STATE_ONLINE": [0, 1, 2, 3, 4]}

    altered = call(
        stub.AlterTopicConfigs,
        pb.AlterTopicConfigsRequest(topic=name, set={"retention.ms": "120000"}, delete=["cleanup.policy"]),
    ).topic
    values = {c.name: c.value for c in altered.configs if not c.is_default}
    assert values == {"retention.ms": "120000"}
    assert dict(topic_of(shared_cluster.metadata(topics=[name]), name).configs) == {"retention.ms": "120000"}

    holders = {n for n in SHARED_RACKS if any(t == name for t, _ in shared_cluster.local_partitions(n))}
    assert holders, "partitions exist on storage nodes before the delete"
    call(stub.DeleteTopic, pb.DeleteTopicRequest(name=name))
    assert name not in call(stub.ListTopics, pb.ListTopicsRequest()).names
    gone = topic_of(shared_cluster.metadata(topics=[name]), name)
    assert gone.error.reason == "UNKNOWN_TOPIC_OR_PARTITION"
    for node_id in SHARED_RACKS:
        assert not [t for t, _ in shared_cluster.local_partitions(node_id) if t == name], "data removed"
    # The name is free again.
    call(stub.CreateTopic, pb.CreateTopicRequest(name=name, partitions=1))


def test_metadata_reports_unknown_and_invalid_topics_per_topic(shared_cluster):
    metadata = shared_cluster.metadata(topics=["no-such-topic", "bad name"])
    errors_by_name = {t.name: t.error.reason for t in metadata.topics}
    assert errors_by_name == {
        "no-such-topic": "UNKNOWN_TOPIC_OR_PARTITION",
        "bad name": "INVALID_TOPIC_EXCEPTION",
    }
    assert sorted(b.node_id for b in metadata.brokers) == [1, 2, 3]
    assert {b.node_id: b.rack for b in metadata.brokers} == SHARED_RACKS


# ---------------------------------------------------------------------------------------------
# Standby
# ---------------------------------------------------------------------------------------------


def test_standby_serves_metadata_and_forwards_admin_calls(shared_cluster):
    active = shared_cluster.wait_active()
    standby = next(c for c in shared_cluster.coordinators if c != active)
    info = call(shared_cluster.stub(standby).GetControllerInfo, pb.GetControllerInfoRequest())
    assert not info.is_active and info.active_id == active
    assert info.active_address == shared_cluster.address(active)

    name = unique("via-standby")
    created = call(
        shared_cluster.stub(standby).CreateTopic, pb.CreateTopicRequest(name=name, partitions=3)
    ).topic
    assert partitions_by_state(created) == {"PARTITION_STATE_ONLINE": [0, 1, 2]}
    # The standby's own cache catches up with the active controller's write.
    shared_cluster.wait_for(
        lambda md: (
            len(topic_of(md, name).partitions) == 3 if any(t.name == name for t in md.topics) else False
        ),
        coordinator_id=standby,
        what="standby sees the topic",
        timeout=5,
    )
    # Errors of the forwarded call come back as the active controller raised them.
    with pytest.raises(errors.TopicAlreadyExistsError):
        call(shared_cluster.stub(standby).CreateTopic, pb.CreateTopicRequest(name=name, partitions=3))


def test_standby_names_the_active_controller_when_it_cannot_forward(shared_cluster):
    active = shared_cluster.wait_active()
    standby = next(c for c in shared_cluster.coordinators if c != active)
    # A call that was already forwarded once is never forwarded again.
    with pytest.raises(grpc.RpcError) as info:
        shared_cluster.stub(standby).CreateTopic(
            pb.CreateTopicRequest(name=unique("x"), partitions=1),
            timeout=5,
            metadata=((FORWARDED_HEADER, "test"),),
        )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(info.value.trailing_metadata())[CONTROLLER_TRAILER] == shared_cluster.address(active)
    error = errors.error_from_rpc(info.value)
    assert isinstance(error, errors.NotControllerError) and error.retriable
    assert active in error.message and shared_cluster.address(active) in error.message


def test_watch_metadata_streams_a_snapshot_then_every_change(shared_cluster):
    """Gateways feed their routing cache from this stream; a standby serves it too."""
    standby = next(c for c in ("c1", "c2") if c != shared_cluster.active_id())
    stream = shared_cluster.stub(standby).WatchMetadata(pb.WatchMetadataRequest(after_revision=0), timeout=30)
    first = next(stream)
    assert first.revision > 0 and len(first.brokers) == 3
    name = unique("watched")
    call(shared_cluster.stub().CreateTopic, pb.CreateTopicRequest(name=name, partitions=2))
    for update in stream:
        assert update.revision > first.revision
        topic = next((t for t in update.topics if t.name == name), None)
        if topic is not None and all(p.state == pb.PARTITION_STATE_ONLINE for p in topic.partitions):
            break
    stream.cancel()
    assert [p.partition for p in topic.partitions] == [0, 1]
