"""``*_to_proto`` / ``*_from_proto`` for the coordinator's domain values (coordinator.proto, admin.proto)."""

from __future__ import annotations

from coordinator.model import (
    ClusterMetadata,
    ConfigValue,
    ControllerStatus,
    PartitionStatus,
    PartitionView,
    TopicLookup,
    TopicSpec,
    TopicView,
)
from services import errors
from services.proto import pb
from services.serde import broker_address_to_proto, error_to_proto

_STATES = {
    PartitionStatus.PENDING: pb.PARTITION_STATE_PENDING,
    PartitionStatus.ONLINE: pb.PARTITION_STATE_ONLINE,
    PartitionStatus.OFFLINE: pb.PARTITION_STATE_OFFLINE,
}


def _partition_error(partition: PartitionView):
    if partition.status is PartitionStatus.ONLINE:
        return None
    why = (
        "its leader has not created it yet"
        if partition.status is PartitionStatus.PENDING
        else "no in-sync replica is live"
    )
    return error_to_proto(
        errors.LeaderNotAvailableError(
            f"partition {partition.topic}-{partition.partition} has no leader: {why}"
        )
    )


def partition_to_proto(partition: PartitionView):
    return pb.PartitionMetadata(
        partition=partition.partition,
        leader=partition.leader,
        leader_epoch=partition.leader_epoch,
        replicas=list(partition.replicas),
        in_sync_replicas=list(partition.isr),
        state=_STATES[partition.status],
        error=_partition_error(partition),
    )


def topic_to_proto(view: TopicView):
    return pb.TopicMetadata(
        name=view.name,
        partitions=[partition_to_proto(p) for p in view.partitions],
        replication_factor=view.replication_factor,
        configs=dict(view.configs),
        partial=view.partial,
    )


def lookup_to_proto(lookup: TopicLookup):
    """TopicMetadata for a lookup: the topic, or just its name and per-topic error."""
    if lookup.view is not None:
        return topic_to_proto(lookup.view)
    error = (
        lookup.error
        if isinstance(lookup.error, errors.TributaryError)
        else errors.TributaryError(str(lookup.error))
    )
    return pb.TopicMetadata(name=lookup.name, error=error_to_proto(error))


def config_to_proto(config: ConfigValue):
    return pb.ConfigEntry(
        name=config.name, value=config.value, is_default=config.is_default, documentation=config.documentation
    )


def description_to_proto(lookup: TopicLookup):
    return pb.TopicDescription(
        metadata=lookup_to_proto(lookup), configs=[config_to_proto(c) for c in lookup.configs]
    )


def metadata_to_proto(metadata: ClusterMetadata):
    controller = metadata.controller
    return pb.GetMetadataResponse(
        brokers=[broker_address_to_proto(b) for b in metadata.brokers],
        topics=[lookup_to_proto(t) for t in metadata.topics],
        controller_id=controller.coordinator_id if controller else "",
        controller_epoch=controller.epoch if controller else 0,
        revision=metadata.revision,
        cluster_id=metadata.cluster_id,
        is_delta=metadata.delta,
        base_revision=metadata.base_revision,
        removed_topics=metadata.removed_topics,
    )


def controller_status_to_proto(status: ControllerStatus):
    active = status.active
    return pb.GetControllerInfoResponse(
        coordinator_id=status.coordinator_id,
        is_active=status.is_active,
        active_id=active.coordinator_id if active else "",
        active_address=active.address if active else "",
        controller_epoch=active.epoch if active else 0,
    )


def topic_spec_from_proto(request) -> TopicSpec:
    return TopicSpec(
        name=request.name,
        partitions=request.partitions,
        replication_factor=request.replication_factor,
        configs=dict(request.configs),
        validate_only=request.validate_only,
    )
