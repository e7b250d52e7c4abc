"""ACLs as the coordinator keeps them: one etcd key per binding, a cache fed by the cluster
watch, and the admin writes (the active controller's fenced transactions).

Layout: ``acls/<id>`` -> the binding as JSON, ``<id>`` a hash of the binding's canonical form, so
creating a binding that exists already is a no-op and bindings need no counter. Every
coordinator's cache follows the keys (``WatchAcls`` streams it to gateways, which decide);
writes go through the active controller, so a deposed one writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from coordinator.watched_keys import WatchedKeys
from services.acls import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from services.etcd.txn import Op

log = logging.getLogger(__name__)

ACLS = "acls/"
#: Most bindings the cluster holds (each is a key every coordinator and gateway keeps in memory).
MAX_ACLS = 100_000


def acl_key(binding: AclBinding) -> str:
    return ACLS + hashlib.sha256(encode_binding(binding)).hexdigest()[:32]


def encode_binding(binding: AclBinding) -> bytes:
    return json.dumps(
        {
            "principal": binding.principal,
            "host": binding.host,
            "resource_type": binding.resource_type.value,
            "pattern_type": binding.pattern_type.value,
            "resource_name": binding.resource_name,
            "operation": binding.operation.value,
            "permission": binding.permission.value,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


def decode_binding(raw: bytes) -> AclBinding:
    value: dict[str, Any] = json.loads(raw)
    return AclBinding(
        str(value["principal"]),
        str(value["host"]),
        ResourceType(value["resource_type"]),
        PatternType(value["pattern_type"]),
        str(value["resource_name"]),
        Operation(value["operation"]),
        Permission(value["permission"]),
    )


class AclCache(WatchedKeys[AclBinding]):
    """Every binding, as of the cluster watch (``entries``: etcd key -> binding)."""

    def __init__(self) -> None:
        super().__init__(ACLS, decode_binding, "ACL")

    @property
    def bindings(self) -> dict[str, AclBinding]:
        return self.entries

    def matching(self, filter_: AclFilter) -> list[tuple[str, AclBinding]]:
        return sorted(
            ((key, b) for key, b in self.entries.items() if filter_.matches(b)), key=lambda kb: kb[0]
        )


def create_ops(bindings: Iterable[AclBinding]) -> list[Op]:
    return [Op.put(acl_key(b), encode_binding(b)) for b in bindings]


def delete_ops(keys: Sequence[str]) -> list[Op]:
    return [Op.delete(key) for key in keys]
