"""Access control lists and the authorizer's decision (Kafka's ``AclAuthorizer`` semantics). Pure.

An ACL binding says: *principal* (``User:alice``, or ``User:*`` for everyone) from *host* (an IP,
or ``*``) is *allowed* or *denied* *operation* on resources of one *type* whose name matches a
*pattern* (``LITERAL``: the name itself, ``*`` meaning every resource of the type; ``PREFIXED``:
every name starting with it). The decision for a request:

1. a super user is allowed everything;
2. any matching DENY refuses (deny beats allow);
3. a matching ALLOW allows -- ``ALL`` covers every operation, and ``DESCRIBE`` is implied by
   ``READ``, ``WRITE``, ``DELETE`` and ``ALTER`` (``DESCRIBE_CONFIGS`` by ``ALTER_CONFIGS``), as in
   Kafka;
4. nothing matches: refused (Kafka's ``allow.everyone.if.no.acl.found=false``).

Principals are ``User:<name>``; the gateway names a client by its TLS certificate's common name
(``User:ANONYMOUS`` without one).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"
WILDCARD = "*"


class ResourceType(enum.Enum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class PatternType(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(enum.Enum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class Permission(enum.Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"


#: Operations an ALLOW of the key implies (Kafka's rules).
_IMPLIED_BY: dict[Operation, tuple[Operation, ...]] = {
    Operation.DESCRIBE: (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.ALTER_CONFIGS,),
}

#: The longest principal, host or resource name an ACL may carry.
MAX_FIELD_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class AclBinding:
    principal: str
    host: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def matches_caller(self, principal: str, host: str) -> bool:
        return self.principal in (principal, "User:*") and self.host in (host, WILDCARD)


def validate_binding(binding: AclBinding) -> None:
    """ValueError for a binding that could never be what its author meant."""
    if not binding.principal.startswith("User:") or len(binding.principal) <= len("User:"):
        raise ValueError(f"principal {binding.principal!r} must be User:<name> (or User:*)")
    if not binding.host:
        raise ValueError("host must be an address or *")
    if not binding.resource_name:
        raise ValueError("resource name must not be empty")
    if binding.resource_type is ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        raise ValueError(f"the CLUSTER resource is named {CLUSTER_NAME}")
    for value in (binding.principal, binding.host, binding.resource_name):
        if len(value) > MAX_FIELD_LENGTH:
            raise ValueError(f"ACL fields are at most {MAX_FIELD_LENGTH} characters")


#: The one cluster resource's name (Kafka's ``kafka-cluster``).
CLUSTER_NAME = "tributary-cluster"


@dataclass(frozen=True, slots=True)
class Request:
    """What a call needs: ``operation`` on the resource ``resource_type``/``name``."""

    operation: Operation
    resource_type: ResourceType
    name: str = CLUSTER_NAME


class Authorizer:
    """Decisions over a fixed set of bindings (build a new one when they change).

    Indexed as Kafka's authorizer is, so a check costs the same with ten ACLs or a hundred
    thousand: literal bindings by (resource type, name) -- the ``*`` wildcard is one such name --
    and prefixed ones by (resource type, prefix), looked up for each prefix length some binding
    of that type has (``bench/authorization.py`` measures it).
    """

    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str] = ()) -> None:
        self.bindings = tuple(bindings)
        self.super_users = frozenset(super_users)
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefix_lengths: dict[ResourceType, list[int]] = {}
        for binding in self.bindings:
            key = (binding.resource_type, binding.resource_name)
            if binding.pattern_type is PatternType.PREFIXED:
                self._prefixed.setdefault(key, []).append(binding)
                lengths = self._prefix_lengths.setdefault(binding.resource_type, [])
                if len(binding.resource_name) not in lengths:
                    lengths.append(len(binding.resource_name))
            else:
                self._literal.setdefault(key, []).append(binding)

    def _candidates(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """The bindings whose resource pattern matches ``name``."""
        found = [
            *self._literal.get((resource_type, name), ()),
            *(self._literal.get((resource_type, WILDCARD), ()) if name != WILDCARD else ()),
        ]
        for length in self._prefix_lengths.get(resource_type, ()):
            if length <= len(name):
                found.extend(self._prefixed.get((resource_type, name[:length]), ()))
        return found

    def authorize(self, principal: str, host: str, request: Request) -> bool:
        if principal in self.super_users:
            return True
        matching = [
            b
            for b in self._candidates(request.resource_type, request.name)
            if b.matches_caller(principal, host)
        ]
        wanted = (request.operation, Operation.ALL)
        if any(b.permission is Permission.DENY and b.operation in wanted for b in matching):
            return False
        allowing = (*wanted, *_IMPLIED_BY.get(request.operation, ()))
        return any(b.permission is Permission.ALLOW and b.operation in allowing for b in matching)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What ``describe`` / ``delete`` select: each field equal to the binding's, or None (any)."""

    principal: str | None = None
    host: str | None = None
    resource_type: ResourceType | None = None
    pattern_type: PatternType | None = None
    resource_name: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def matches(self, binding: AclBinding) -> bool:
        return all(
            wanted is None or wanted == getattr(binding, name)
            for name, wanted in (
                ("principal", self.principal),
                ("host", self.host),
                ("resource_type", self.resource_type),
                ("pattern_type", self.pattern_type),
                ("resource_name", self.resource_name),
                ("operation", self.operation),
                ("permission", self.permission),
            )
        )
