"""Authorization at the gateway: who is calling, what each call needs, and the decision.

* **Principal**: the common name of the client's TLS certificate (``User:<CN>``, as Kafka's
  ``ssl.principal.mapping.rules`` commonly maps it); a client without one is ``User:ANONYMOUS``.
* **What a call needs**: :func:`required` maps each Gateway RPC and its request to the
  operations and resources Kafka checks for the same request (Produce: WRITE on the topic, Fetch:
  READ, JoinGroup: READ on the group, CreateTopic: CREATE on the topic or the cluster, ...).
  Calls that list things (metadata, topics, groups) are not refused: their answers are filtered to
  what the principal may DESCRIBE.
* **The decision** is :class:`services.acls.Authorizer`'s over the ACLs the coordinators stream
  (``WatchAcls``), kept by :func:`follow_acls`. Until the first list has arrived every call is
  refused with a retriable error (never let through).

A refusal is PERMISSION_DENIED with Kafka's reason: TOPIC_AUTHORIZATION_FAILED,
GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED or TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from services import errors
from services.acls import (
    ANONYMOUS,
    CLUSTER_NAME,
    AclBinding,
    Authorizer,
    Operation,
    Request,
    ResourceType,
)

log = logging.getLogger(__name__)

TOPIC, GROUP, CLUSTER, TXN = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.DESCRIBE,
)

_REFUSALS: dict[ResourceType, type[errors.TributaryError]] = {
    TOPIC: errors.TopicAuthorizationFailedError,
    GROUP: errors.GroupAuthorizationFailedError,
    CLUSTER: errors.ClusterAuthorizationFailedError,
    TXN: errors.TransactionalIdAuthorizationFailedError,
}


def principal_from_common_name(common_name: str | None) -> str:
    return f"User:{common_name}" if common_name else ANONYMOUS


def grpc_principal(context) -> str:
    """The principal of a gRPC call (its TLS peer's certificate common name)."""
    try:
        names = context.auth_context().get("x509_common_name") or []
    except Exception:  # noqa: BLE001 -- a context without TLS
        names = []
    return principal_from_common_name(names[0].decode() if names else None)


def grpc_host(context) -> str:
    """The caller's IP from the gRPC peer string (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``)."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return rest.rpartition(":")[0] if kind == "ipv4" else peer


def certificate_principal(peercert: dict | None) -> str:
    """The principal of a raw (asyncio TLS) connection, from ``get_extra_info("peercert")``."""
    if not peercert:
        return ANONYMOUS
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return principal_from_common_name(value)
    return ANONYMOUS


# ---- what each RPC needs --------------------------------------------------------------------


def _topics(names: Iterable[str], operation: Operation) -> list[Request]:
    return [Request(operation, TOPIC, name) for name in dict.fromkeys(names)]


def _cluster(operation: Operation) -> list[Request]:
    return [Request(operation, CLUSTER, CLUSTER_NAME)]


_REQUIRED: dict[str, Callable[[Any], list[Request]]] = {
    "Produce": lambda r: (
        _topics([r.topic], WRITE)
        + ([Request(WRITE, TXN, r.transactional_id)] if getattr(r, "transactional_id", "") else [])
    ),
    "Fetch": lambda r: _topics((p.topic for p in r.partitions), READ),
    "ListOffsets": lambda r: _topics((p.topic for p in r.partitions), DESCRIBE),
    "DeleteRecords": lambda r: _topics((p.topic for p in r.partitions), DELETE),
    "DeleteTopic": lambda r: _topics([r.name], DELETE),
    "DescribeTopics": lambda r: _topics(r.names, DESCRIBE),
    "CreatePartitions": lambda r: _topics([r.topic], ALTER),
    "AlterTopicConfigs": lambda r: [Request(Operation.ALTER_CONFIGS, TOPIC, r.topic)],
    "ElectLeaders": lambda r: _cluster(ALTER),
    "AlterPartitionReassignments": lambda r: _cluster(ALTER),
    "ListPartitionReassignments": lambda r: _cluster(DESCRIBE),
    "JoinGroup": lambda r: [Request(READ, GROUP, r.group_id)],
    "Heartbeat": lambda r: [Request(READ, GROUP, r.group_id)],
    "LeaveGroup": lambda r: [Request(READ, GROUP, r.group_id)],
    "CommitOffsets": lambda r: (
        [Request(READ, GROUP, r.group_id)] + _topics((o.topic for o in r.offsets), READ)
    ),
    "FetchCommittedOffsets": lambda r: [Request(DESCRIBE, GROUP, r.group_id)],
    "DescribeGroup": lambda r: [Request(DESCRIBE, GROUP, r.group_id)],
    "ResetGroupOffsets": lambda r: [Request(READ, GROUP, r.group_id)],
    "DeleteGroup": lambda r: [Request(DELETE, GROUP, r.group_id)],
    "InitProducerId": lambda r: (
        [Request(WRITE, TXN, r.transactional_id)]
        if r.transactional_id
        else _cluster(Operation.IDEMPOTENT_WRITE)
    ),
    "AddPartitionsToTxn": lambda r: (
        [Request(WRITE, TXN, r.transactional_id)] + _topics((p.topic for p in r.partitions), WRITE)
    ),
    "AddOffsetsToTxn": lambda r: [Request(WRITE, TXN, r.transactional_id), Request(READ, GROUP, r.group_id)],
    "TxnOffsetCommit": lambda r: [Request(READ, GROUP, r.group_id)],
    "EndTxn": lambda r: [Request(WRITE, TXN, r.transactional_id)],
    "DescribeTransactions": lambda r: (
        [Request(DESCRIBE, TXN, t) for t in r.transactional_ids] or _cluster(DESCRIBE)
    ),
    "CreateAcls": lambda r: _cluster(ALTER),
    "DeleteAcls": lambda r: _cluster(ALTER),
    "DescribeAcls": lambda r: _cluster(DESCRIBE),
    # Kafka: ALTER_CONFIGS / DESCRIBE_CONFIGS on the cluster for client quotas.
    "AlterClientQuotas": lambda r: _cluster(Operation.ALTER_CONFIGS),
    "DescribeClientQuotas": lambda r: _cluster(Operation.DESCRIBE_CONFIGS),
}

#: Calls every principal may make: their answers are filtered instead (or they carry nothing).
FILTERED = frozenset({"GetMetadata", "ListTopics", "ListGroups"})


def required(method: str, request) -> list[Request]:
    """What ``method`` with ``request`` needs. CreateTopic is special (cluster CREATE, or the
    topic's): see :meth:`Gatekeeper.check`."""
    needs = _REQUIRED.get(method)
    if needs is None:
        raise KeyError(f"no authorization rule for Gateway.{method}")
    return needs(request)


class Gatekeeper:
    """The gateway's authorization: the current ACLs (or none yet) and the super users."""

    def __init__(self, super_users: Iterable[str] = ()) -> None:
        self.super_users = frozenset(super_users)
        self._authorizer: Authorizer | None = None
        self.ready = asyncio.Event()

    def update(self, bindings: Iterable[AclBinding]) -> None:
        self.install(Authorizer(bindings, self.super_users))

    def install(self, authorizer: Authorizer) -> None:
        """Take a built authorizer (built off the event loop: 100,000 ACLs take ~0.2 s)."""
        self._authorizer = authorizer
        self.ready.set()

    def allowed(self, principal: str, host: str, request: Request) -> bool:
        if principal in self.super_users:
            return True
        if self._authorizer is None:
            raise errors.CoordinatorNotAvailableError("the gateway has not received the ACLs yet; try again")
        return self._authorizer.authorize(principal, host, request)

    def check(self, principal: str, host: str, method: str, request) -> None:
        """Raise the refusal of the first need that is not allowed."""
        if method == "CreateTopic":
            if not (
                self.allowed(principal, host, Request(CREATE, CLUSTER, CLUSTER_NAME))
                or self.allowed(principal, host, Request(CREATE, TOPIC, request.name))
            ):
                raise errors.TopicAuthorizationFailedError(
                    f"{principal} may not create topic {request.name!r} "
                    "(needs CREATE on it or on the cluster)"
                )
            return
        for need in required(method, request):
            if not self.allowed(principal, host, need):
                raise _REFUSALS[need.resource_type](
                    f"{principal} from {host} may not {need.operation.value} "
                    f"{need.resource_type.value.lower()} {need.name!r}"
                )

    def may_describe(self, principal: str, host: str, resource_type: ResourceType, name: str) -> bool:
        return self.allowed(principal, host, Request(DESCRIBE, resource_type, name))


def _authorizer_of(acls: list, super_users: frozenset[str]) -> Authorizer:
    from services.serde import acl_from_proto

    return Authorizer([acl_from_proto(a) for a in acls], super_users)


async def follow_acls(pool, gatekeeper: Gatekeeper) -> None:
    """Keep ``gatekeeper`` on the coordinators' ACLs (``WatchAcls``). Runs until cancelled."""
    from gateway.server.coordinators import follow_snapshots
    from services.proto import pb

    async def apply(snapshot) -> None:
        acls = list(snapshot.acls)  # the index is built off the event loop
        gatekeeper.install(await asyncio.to_thread(_authorizer_of, acls, gatekeeper.super_users))

    await follow_snapshots(pool, lambda stub: stub.WatchAcls(pb.WatchAclsRequest()), apply, "ACLs")
