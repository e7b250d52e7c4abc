"""``*_to_proto`` / ``*_from_proto`` pairs for types shared by several services.

Servicers only translate: they decode with these, call a plain handler, and encode the result.
"""

from __future__ import annotations

from services import errors
from services.leader_and_isr import LeaderAndIsr
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
    )
