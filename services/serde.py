"""``*_to_proto`` / ``*_from_proto`` pairs for types shared by several services.

Servicers only translate: they decode with these, call a plain handler, and encode the result.
"""

from __future__ import annotations

from services import errors
from services.acks import Acks
from services.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    validate_binding,
)
from services.append_result import AppendResult
from services.broker_address import BrokerAddress
from services.leader_and_isr import LeaderAndIsr
from services.offset_spec import EARLIEST, LATEST
from services.proto import pb


def error_to_proto(error: errors.TributaryError):
    """The per-partition ``Error`` message for ``error``."""
    return pb.Error(
        reason=error.reason, kafka_code=error.kafka_code, message=error.message, retriable=error.retriable
    )


def error_from_proto(message) -> errors.TributaryError | None:
    """The typed error in a per-partition ``Error`` field, or None when it is unset."""
    if message is None or not message.reason:
        return None
    return errors.make_error(message.reason, message.message)


def broker_address_to_proto(address: BrokerAddress):
    return pb.BrokerInfo(
        node_id=address.node_id,
        host=address.host,
        grpc_port=address.grpc_port,
        fetch_port=address.fetch_port,
        rack=address.rack,
    )


def broker_address_from_proto(message) -> BrokerAddress:
    """A ``BrokerInfo`` message (cluster metadata) as a :class:`BrokerAddress`."""
    return BrokerAddress(message.node_id, message.host, message.grpc_port, message.fetch_port, message.rack)


def leader_and_isr_to_proto(state: LeaderAndIsr):
    return pb.LeaderAndIsr(
        topic=state.topic,
        partition=state.partition,
        replicas=list(state.replicas),
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        isr=list(state.isr),
        version=state.version,
        deleting=state.deleting,
        adding_replicas=list(state.adding),
        throttle_bytes_per_second=state.throttle_bytes_per_s,
    )


def leader_and_isr_from_proto(message) -> LeaderAndIsr:
    return LeaderAndIsr(
        topic=message.topic,
        partition=message.partition,
        replicas=tuple(message.replicas),
        leader=message.leader,
        leader_epoch=message.leader_epoch,
        isr=tuple(message.isr),
        version=message.version,
        deleting=message.deleting,
        adding=tuple(message.adding_replicas),
        throttle_bytes_per_s=message.throttle_bytes_per_second,
    )


def offset_spec_to_proto(timestamp: int):
    """The ``OffsetSpec`` of a Kafka-style lookup timestamp (:mod:`services.offset_spec`)."""
    if timestamp == EARLIEST:
        return pb.OffsetSpec(earliest=True)
    if timestamp == LATEST:
        return pb.OffsetSpec(latest=True)
    return pb.OffsetSpec(timestamp=timestamp)


def offset_spec_from_proto(spec) -> int:
    """An ``OffsetSpec`` as a Kafka-style lookup timestamp: EARLIEST, LATEST or ms >= 0.

    Raises INVALID_REQUEST for a negative timestamp or a spec that sets none of the three.
    """
    which = spec.WhichOneof("spec")
    if which == "earliest":
        return EARLIEST
    if which == "latest":
        return LATEST
    if which == "timestamp":
        if spec.timestamp < 0:
            raise errors.InvalidRequestError(f"timestamp {spec.timestamp} is negative")
        return spec.timestamp
    raise errors.InvalidRequestError("offset spec must set earliest, latest or timestamp")


_ACKS_TO_PROTO = {Acks.NONE: pb.ACKS_NONE, Acks.LEADER: pb.ACKS_LEADER, Acks.ALL: pb.ACKS_ALL}
_ACKS_FROM_PROTO: dict[int, Acks] = {
    pb.ACKS_UNSPECIFIED: Acks.ALL,  # Kafka's producer default
    pb.ACKS_NONE: Acks.NONE,
    pb.ACKS_LEADER: Acks.LEADER,
    pb.ACKS_ALL: Acks.ALL,
}


def acks_to_proto(acks: Acks) -> pb.Acks:
    return _ACKS_TO_PROTO[acks]


def acks_from_proto(value: int) -> Acks:
    """A request's ``acks`` (unspecified = all); an unknown number is INVALID_REQUIRED_ACKS."""
    acks = _ACKS_FROM_PROTO.get(value)
    if acks is None:
        raise errors.InvalidRequiredAcksError(f"acks value {value} is not one of none, leader, all")
    return acks


def append_result_to_proto(result: AppendResult):
    return pb.PartitionAppendResult(
        topic=result.topic,
        partition=result.partition,
        error=error_to_proto(result.error) if result.error is not None else None,
        base_offset=result.base_offset,
        last_offset=result.last_offset,
        log_append_time=result.log_append_time,
        log_start_offset=result.log_start_offset,
        record_count=result.record_count,
    )


def append_result_from_proto(message) -> AppendResult:
    return AppendResult(
        topic=message.topic,
        partition=message.partition,
        base_offset=message.base_offset,
        last_offset=message.last_offset,
        log_append_time=message.log_append_time,
        log_start_offset=message.log_start_offset,
        record_count=message.record_count,
        error=error_from_proto(message.error) if message.HasField("error") else None,
    )


def acl_to_proto(binding: AclBinding):
    return pb.AclBinding(
        principal=binding.principal,
        host=binding.host,
        resource_type=binding.resource_type.value,
        pattern_type=binding.pattern_type.value,
        resource_name=binding.resource_name,
        operation=binding.operation.value,
        permission=binding.permission.value,
    )


def acl_from_proto(message) -> AclBinding:
    """A binding (InvalidRequestError naming the field for an unknown type, operation, ...)."""
    try:
        binding = AclBinding(
            message.principal,
            message.host,
            ResourceType(message.resource_type.upper()),
            PatternType((message.pattern_type or "LITERAL").upper()),
            message.resource_name,
            Operation(message.operation.upper()),
            Permission(message.permission.upper()),
        )
        validate_binding(binding)
    except ValueError as exc:
        raise errors.InvalidRequestError(f"ACL binding: {exc}") from None
    return binding


def acl_filter_from_proto(message) -> AclFilter:
    """A filter: empty fields match anything; others as in :func:`acl_from_proto`."""
    try:
        return AclFilter(
            principal=message.principal or None,
            host=message.host or None,
            resource_type=ResourceType(message.resource_type.upper()) if message.resource_type else None,
            pattern_type=PatternType(message.pattern_type.upper()) if message.pattern_type else None,
            resource_name=message.resource_name or None,
            operation=Operation(message.operation.upper()) if message.operation else None,
            permission=Permission(message.permission.upper()) if message.permission else None,
        )
    except ValueError as exc:
        raise errors.InvalidRequestError(f"ACL filter: {exc}") from None


def acl_filter_to_proto(acl_filter: AclFilter):
    """A filter as an AclBinding message whose empty fields match anything."""
    return pb.AclBinding(
        principal=acl_filter.principal or "",
        host=acl_filter.host or "",
        resource_type=acl_filter.resource_type.value if acl_filter.resource_type else "",
        pattern_type=acl_filter.pattern_type.value if acl_filter.pattern_type else "",
        resource_name=acl_filter.resource_name or "",
        operation=acl_filter.operation.value if acl_filter.operation else "",
        permission=acl_filter.permission.value if acl_filter.permission else "",
    )
