"""Consumer-group values to and from ``groups.proto`` messages: pure conversions, no I/O.

One ``*_to_proto`` / ``*_from_proto`` function per type, as the services' ``serde`` modules do;
the consumer's group coordinator and the admin client both use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.client.structs import (
    ASSIGNORS,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetAndMetadata,
    PartitionLag,
    TopicPartition,
)
from services.errors import TributaryError
from services.proto import pb
from services.serde import error_from_proto

_ASSIGNOR_ENUMS = {
    "cooperative-sticky": pb.ASSIGNOR_COOPERATIVE_STICKY,
    "range": pb.ASSIGNOR_RANGE,
    "roundrobin": pb.ASSIGNOR_ROUND_ROBIN,
    "sticky": pb.ASSIGNOR_STICKY,
}
_ASSIGNOR_NAMES: dict[int, str] = {value: name for name, value in _ASSIGNOR_ENUMS.items()}
assert set(_ASSIGNOR_ENUMS) == set(ASSIGNORS)


def assignor_to_proto(name: str | None) -> int:
    """Kafka's assignor name as the ``Assignor`` enum; None = unspecified (the group's own)."""
    if name is None:
        return pb.ASSIGNOR_UNSPECIFIED
    try:
        return _ASSIGNOR_ENUMS[name]
    except KeyError:
        raise ValueError(
            f"partition_assignment_strategy must be one of {', '.join(ASSIGNORS)}, not {name!r}"
        ) from None


def assignor_from_proto(value: int) -> str:
    return _ASSIGNOR_NAMES.get(value, "")


def tps_to_proto(partitions: Iterable[TopicPartition]) -> list:
    return [pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions]


def tps_from_proto(messages) -> list[TopicPartition]:
    return [TopicPartition(m.topic, m.partition) for m in messages]


def subscription_to_proto(topics: Iterable[str], pattern: str | None):
    return pb.Subscription(topics=list(topics), pattern=pattern or "")


def offsets_to_proto(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list:
    return [
        pb.OffsetCommit(topic=tp.topic, partition=tp.partition, offset=om.offset, metadata=om.metadata)
        for tp, om in sorted(offsets.items())
    ]


def as_offset_and_metadata(value) -> OffsetAndMetadata:
    """An ``OffsetAndMetadata``, an ``(offset, metadata)`` pair or a plain offset."""
    if isinstance(value, OffsetAndMetadata):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetAndMetadata(value)
    if isinstance(value, tuple) and len(value) == 2:
        return OffsetAndMetadata(int(value[0]), str(value[1] or ""))
    raise TypeError(f"an offset to commit must be an int or OffsetAndMetadata, not {value!r}")


def _error(message) -> TributaryError | None:
    return error_from_proto(message.error) if message.HasField("error") and message.error.reason else None


def committed_from_proto(message) -> tuple[TopicPartition, OffsetAndMetadata | None, TributaryError | None]:
    """One ``CommittedOffset``: the partition, its offset (None when nothing is committed), its error."""
    tp = TopicPartition(message.topic, message.partition)
    offset = OffsetAndMetadata(message.offset, message.metadata) if message.offset >= 0 else None
    return tp, offset, _error(message)


def commit_result_from_proto(message) -> tuple[TopicPartition, TributaryError | None]:
    return TopicPartition(message.topic, message.partition), _error(message)


def listing_from_proto(message) -> GroupListing:
    return GroupListing(message.group_id, message.state, message.member_count)


def member_from_proto(message) -> MemberDescription:
    return MemberDescription(
        member_id=message.member_id,
        group_instance_id=message.group_instance_id or None,
        client_id=message.client_id,
        host=message.host,
        topics=tuple(message.subscription.topics),
        pattern=message.subscription.pattern or None,
        assignment=tuple(tps_from_proto(message.assignment)),
        owned=tuple(tps_from_proto(message.owned)),
    )


def lag_from_proto(message) -> PartitionLag:
    error = _error(message)
    unknown_end = error is not None or message.log_end_offset < 0
    return PartitionLag(
        topic=message.topic,
        partition=message.partition,
        committed_offset=message.committed_offset if message.committed_offset >= 0 else None,
        log_end_offset=None if unknown_end else message.log_end_offset,
        lag=None if unknown_end else message.lag,
        owner=message.owner or None,
        error=error.reason if error is not None else None,
    )


def description_from_proto(message) -> GroupDescription:
    return GroupDescription(
        group_id=message.group_id,
        state=message.state,
        generation=message.generation_id,
        assignor=assignor_from_proto(message.assignor),
        members=tuple(member_from_proto(m) for m in message.members),
        partitions=tuple(lag_from_proto(p) for p in message.partitions),
    )
