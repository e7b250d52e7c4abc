"""ACLs as the coordinator keeps them: one etcd key per binding, a cache fed by the cluster
watch, and the admin writes (the active controller's fenced transactions).

Layout: ``acls/<id>`` -> the binding as JSON, ``<id>`` a hash of the binding's canonical form, so
creating a binding that exists already is a no-op and bindings need no counter. Every
coordinator's cache follows the keys (``WatchAcls`` streams it to gateways, which decide);
writes go through the active controller, so a deposed one writes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from services.acls import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from services.etcd.txn import Op
from services.etcd.values import EventType, WatchEvent, WatchResync

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


class AclCache:
    """Every binding, as of the cluster watch; ``changed`` is set on each change (for streams)."""

    def __init__(self) -> None:
        self.bindings: dict[str, AclBinding] = {}
        self.version = 0
        self._changed = asyncio.Condition()

    def apply(self, batch: list[WatchEvent] | WatchResync) -> None:
        """A cluster-watch response (a batch listener of the metadata cache)."""
        before = self.version
        if isinstance(batch, WatchResync):
            self.bindings = {}
            for kv in batch.kvs:
                if kv.key.startswith(ACLS):
                    self._put(kv.key, kv.value)
            self.version += 1
        else:
            for event in batch:
                if not event.kv.key.startswith(ACLS):
                    continue
                if event.type is EventType.PUT:
                    self._put(event.kv.key, event.kv.value)
                else:
                    self.bindings.pop(event.kv.key, None)
                self.version = before + 1
        if self.version != before:
            asyncio.get_running_loop().create_task(self._notify())

    def _put(self, key: str, raw: bytes) -> None:
        try:
            self.bindings[key] = decode_binding(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ignoring ACL key %r with a bad value: %s", key, exc)
            self.bindings.pop(key, None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_changed(self, version: int, timeout: float) -> bool:
        """Wait until the version passes ``version`` (True) or ``timeout`` (False)."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: self.version != version)
            except TimeoutError:
                return False
        return True

    def matching(self, filter_: AclFilter) -> list[tuple[str, AclBinding]]:
        return sorted(
            ((key, b) for key, b in self.bindings.items() if filter_.matches(b)), key=lambda kb: kb[0]
        )


def create_ops(bindings: Iterable[AclBinding]) -> list[Op]:
    return [Op.put(acl_key(b), encode_binding(b)) for b in bindings]


def delete_ops(keys: Sequence[str]) -> list[Op]:
    return [Op.delete(key) for key in keys]
