"""``*_to_proto`` / ``*_from_proto`` for consumer groups (groups.proto)."""

from __future__ import annotations

from coordinator.groups.model import (
    COOPERATIVE_STICKY,
    DEFAULT_MAX_POLL_INTERVAL_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    EMPTY,
    PREPARING_REBALANCE,
    RANGE,
    ROUND_ROBIN,
    STABLE,
    STICKY,
    CommitParams,
    CommittedOffset,
    GroupDescription,
    GroupListing,
    HeartbeatParams,
    JoinParams,
    MemberAssignment,
    MemberDescription,
    OffsetCommit,
    PartitionLag,
    PartitionResult,
    ResetSpec,
    Subscription,
)
from services import errors
from services.proto import pb
from services.serde import error_to_proto
from services.topic_partition import TopicPartition

_ASSIGNORS: dict[pb.Assignor, str] = {
    pb.ASSIGNOR_RANGE: RANGE,
    pb.ASSIGNOR_ROUND_ROBIN: ROUND_ROBIN,
    pb.ASSIGNOR_STICKY: STICKY,
    pb.ASSIGNOR_COOPERATIVE_STICKY: COOPERATIVE_STICKY,
}
_ASSIGNOR_ENUMS = {name: value for value, name in _ASSIGNORS.items()}


def assignor_from_proto(value: pb.Assignor) -> str:
    """Kafka's assignor name; "" for ASSIGNOR_UNSPECIFIED (the group's, else the default)."""
    if value == pb.ASSIGNOR_UNSPECIFIED:
        return ""
    if value not in _ASSIGNORS:
        raise errors.InvalidRequestError(f"unknown assignor {value}")
    return _ASSIGNORS[value]


def assignor_to_proto(name: str) -> pb.Assignor:
    return _ASSIGNOR_ENUMS.get(name, pb.ASSIGNOR_UNSPECIFIED)


def tp_to_proto(tp: TopicPartition):
    return pb.TopicPartition(topic=tp.topic, partition=tp.partition)


def tps_to_proto(tps) -> list:
    return [tp_to_proto(tp) for tp in tps]


def tps_from_proto(messages) -> list[TopicPartition]:
    return [TopicPartition(m.topic, m.partition) for m in messages]


def subscription_from_proto(message) -> Subscription:
    return Subscription(tuple(message.topics), message.pattern)


def subscription_to_proto(subscription: Subscription):
    return pb.Subscription(topics=list(subscription.topics), pattern=subscription.pattern)


def _error(error: errors.TributaryError | None):
    return error_to_proto(error) if error is not None else None


# ---- join / heartbeat / leave ------------------------------------------------------------------------


def join_from_proto(request, host: str) -> JoinParams:
    return JoinParams(
        group_id=request.group_id,
        member_id=request.member_id,
        instance_id=request.group_instance_id,
        client_id=request.client_id,
        host=host,
        subscription=subscription_from_proto(request.subscription),
        assignor=assignor_from_proto(request.assignor),
        session_timeout_ms=request.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS,
        max_poll_interval_ms=request.max_poll_interval_ms or DEFAULT_MAX_POLL_INTERVAL_MS,
    )


def join_to_proto(answer: MemberAssignment):
    return pb.JoinGroupResponse(
        member_id=answer.member_id,
        generation_id=answer.generation,
        assignor=assignor_to_proto(answer.assignor),
        assignment=tps_to_proto(answer.assignment),
        pending=tps_to_proto(answer.pending),
        heartbeat_interval_ms=answer.heartbeat_interval_ms,
        revoke=tps_to_proto(answer.revoke),
    )


def heartbeat_from_proto(request) -> HeartbeatParams:
    return HeartbeatParams(
        group_id=request.group_id,
        member_id=request.member_id,
        generation=request.generation_id,
        owned=frozenset(tps_from_proto(request.owned)),
        polled=request.polled,
        instance_id=request.group_instance_id,
    )


def heartbeat_to_proto(answer: MemberAssignment):
    return pb.HeartbeatResponse(
        generation_id=answer.generation,
        assignment=tps_to_proto(answer.assignment),
        revoke=tps_to_proto(answer.revoke),
        pending=tps_to_proto(answer.pending),
    )


# ---- offsets ------------------------------------------------------------------------------------------


def offset_commit_from_proto(message) -> OffsetCommit:
    return OffsetCommit(message.topic, message.partition, message.offset, message.metadata)


def commit_from_proto(request) -> CommitParams:
    return CommitParams(
        group_id=request.group_id,
        member_id=request.member_id,
        generation=request.generation_id,
        offsets=tuple(offset_commit_from_proto(o) for o in request.offsets),
        instance_id=request.group_instance_id,
    )


def commit_results_to_proto(results: list[PartitionResult]):
    return pb.CommitOffsetsResponse(
        results=[
            pb.OffsetCommitResult(topic=r.tp.topic, partition=r.tp.partition, error=_error(r.error))
            for r in results
        ]
    )


def committed_to_proto(committed: CommittedOffset):
    return pb.CommittedOffset(
        topic=committed.tp.topic,
        partition=committed.tp.partition,
        offset=committed.offset,
        metadata=committed.metadata,
        commit_timestamp=committed.commit_timestamp,
        error=_error(committed.error),
    )


def reset_spec_from_proto(request) -> ResetSpec:
    explicit = tuple(offset_commit_from_proto(o) for o in request.explicit)
    which = request.spec.WhichOneof("spec") if request.HasField("spec") else None
    if explicit:
        return ResetSpec(explicit=explicit)
    if which in ("earliest", "latest"):
        return ResetSpec(kind=which)
    if which == "timestamp":
        if request.spec.timestamp < 0:
            raise errors.InvalidRequestError(f"timestamp {request.spec.timestamp} is negative")
        return ResetSpec(kind="timestamp", timestamp=request.spec.timestamp)
    raise errors.InvalidRequestError(
        "a reset needs an offset spec (earliest, latest, timestamp) or explicit offsets"
    )


# ---- listing and describing ------------------------------------------------------------------------


#: Kafka's state names (the model's) -> the contract's GroupState enum.
_GROUP_STATE = {
    EMPTY: pb.GROUP_STATE_EMPTY,
    STABLE: pb.GROUP_STATE_STABLE,
    PREPARING_REBALANCE: pb.GROUP_STATE_PREPARING_REBALANCE,
}


def group_state_to_proto(state: str) -> pb.GroupState:
    return _GROUP_STATE.get(state, pb.GROUP_STATE_UNSPECIFIED)


def listing_to_proto(listing: GroupListing):
    return pb.GroupListing(
        group_id=listing.group_id,
        state=listing.state,
        member_count=listing.member_count,
        group_state=group_state_to_proto(listing.state),
    )


def member_to_proto(described: MemberDescription):
    member = described.member
    return pb.GroupMember(
        member_id=member.member_id,
        group_instance_id=member.instance_id,
        client_id=member.client_id,
        host=member.host,
        subscription=subscription_to_proto(member.subscription),
        assignment=tps_to_proto(described.assignment),
        owned=tps_to_proto(described.owned),
    )


def lag_to_proto(partition: PartitionLag):
    return pb.PartitionLag(
        topic=partition.tp.topic,
        partition=partition.tp.partition,
        committed_offset=partition.committed_offset,
        log_end_offset=partition.log_end_offset,
        lag=partition.lag,
        owner=partition.owner,
        error=_error(partition.error),
    )


def description_to_proto(description: GroupDescription):
    return pb.DescribeGroupResponse(
        group_id=description.group_id,
        state=description.state,
        group_state=group_state_to_proto(description.state),
        generation_id=description.generation,
        assignor=assignor_to_proto(description.assignor),
        members=[member_to_proto(m) for m in description.members],
        partitions=[lag_to_proto(p) for p in description.partitions],
    )
