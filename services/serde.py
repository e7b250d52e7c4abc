"""``*_to_proto`` / ``*_from_proto`` pairs for types shared by several services.

Servicers only translate: they decode with these, call a plain handler, and encode the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
from services.quotas import (
    CLIENT_ID,
    DEFAULT,
    ENTITY_TYPES,
    USER,
    ComponentFilter,
    MatchType,
    QuotaEntity,
    QuotaFilter,
    apply_alteration,
    validate_entity,
    validate_filter,
)


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


# ---- client quotas ---------------------------------------------------------------------------


def quota_entity_to_proto(entity: QuotaEntity):
    return pb.ClientQuotaEntity(
        parts=[
            pb.ClientQuotaEntityPart(entity_type=kind, is_default=True)
            if name == DEFAULT
            else pb.ClientQuotaEntityPart(entity_type=kind, name=name)
            for kind, name in entity.parts().items()
        ]
    )


def quota_entity_from_proto(message) -> QuotaEntity:
    """An entity (InvalidRequestError naming what is wrong: an unknown type, a part twice, a
    name and the default at once, the name <default> spelled out)."""
    parts: dict[str, str] = {}
    try:
        for part in message.parts:
            kind = part.entity_type
            if kind not in ENTITY_TYPES:
                raise ValueError(f"unknown entity type {kind!r} (known: {', '.join(ENTITY_TYPES)})")
            if kind in parts:
                raise ValueError(f"entity type {kind} appears twice")
            if part.is_default and part.name:
                raise ValueError(f"the {kind} part has a name ({part.name!r}) and is the default")
            if part.name == DEFAULT:
                raise ValueError(f"the default {kind} is is_default=true, not the name {DEFAULT}")
            parts[kind] = DEFAULT if part.is_default else part.name
        entity = QuotaEntity(parts.get(USER), parts.get(CLIENT_ID))
        validate_entity(entity)
    except ValueError as exc:
        raise errors.InvalidRequestError(f"quota entity: {exc}") from None
    return entity


def quota_alteration_from_proto(message) -> tuple[QuotaEntity, list[tuple[str, float | None]]]:
    """(entity, [(key, value or None to remove)]) of one alteration; the values are checked
    against the keys (InvalidRequestError naming the entity and the key)."""
    entity = quota_entity_from_proto(message.entity)
    changes = [(op.key, None if op.remove else op.value) for op in message.ops]
    if not changes:
        raise errors.InvalidRequestError(f"quota entity {entity}: no quota key to set or remove")
    try:
        apply_alteration({}, changes)
    except ValueError as exc:
        raise errors.InvalidRequestError(f"quota entity {entity}: {exc}") from None
    return entity, changes


def quota_alteration_to_proto(entity: QuotaEntity, changes: Iterable[tuple[str, float | None]]):
    return pb.ClientQuotaAlteration(
        entity=quota_entity_to_proto(entity),
        ops=[
            pb.ClientQuotaOp(key=key, remove=True)
            if value is None
            else pb.ClientQuotaOp(key=key, value=value)
            for key, value in changes
        ],
    )


def quota_entry_to_proto(entity: QuotaEntity, values: Mapping[str, float]):
    return pb.ClientQuotaEntry(entity=quota_entity_to_proto(entity), values=dict(values))


def quota_entry_from_proto(message) -> tuple[QuotaEntity, dict[str, float]]:
    """An entry as stored (its values checked: InvalidRequestError otherwise)."""
    entity = quota_entity_from_proto(message.entity)
    try:
        values = apply_alteration({}, list(message.values.items()))
    except ValueError as exc:
        raise errors.InvalidRequestError(f"quota entity {entity}: {exc}") from None
    return entity, values


def quota_filter_from_proto(message) -> QuotaFilter:
    try:
        components = tuple(
            ComponentFilter(c.entity_type, MatchType((c.match_type or "EXACT").upper()), c.name)
            for c in message.components
        )
        quota_filter = QuotaFilter(components, message.strict)
        validate_filter(quota_filter)
    except ValueError as exc:
        raise errors.InvalidRequestError(f"quota filter: {exc}") from None
    return quota_filter


def quota_filter_to_proto(quota_filter: QuotaFilter):
    return pb.DescribeClientQuotasRequest(
        components=[
            pb.ClientQuotaFilterComponent(entity_type=c.entity_type, match_type=c.match.value, name=c.name)
            for c in quota_filter.components
        ],
        strict=quota_filter.strict,
    )
