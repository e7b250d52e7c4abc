"""Client quotas as the coordinator keeps them: one etcd key per entity, a cache fed by the
cluster watch, and the admin writes (the active controller's fenced transactions).

Layout: ``quotas/<id>`` -> ``{"user": .., "client_id": .., "values": {key: value}}`` as JSON,
``<id>`` a hash of the entity (user and client id names may hold any character, so they are not
spelled into the key). An entity whose last key is removed has its key deleted. Every
coordinator's cache follows the keys (``WatchClientQuotas`` streams it to gateways, which
enforce); writes go through the active controller, so a deposed one writes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any

from services.etcd.txn import Op
from services.etcd.values import EventType, WatchEvent, WatchResync
from services.quotas import QuotaEntity, QuotaFilter, QuotaResolver, apply_alteration, validate_entity

log = logging.getLogger(__name__)

QUOTAS = "quotas/"
#: Most entities the cluster holds (each is a key every coordinator and gateway keeps in memory).
MAX_QUOTA_ENTITIES = 100_000


def quota_key(entity: QuotaEntity) -> str:
    canonical = json.dumps([entity.user, entity.client_id], separators=(",", ":"))
    return QUOTAS + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def encode_entry(entity: QuotaEntity, values: dict[str, float]) -> bytes:
    return json.dumps(
        {"user": entity.user, "client_id": entity.client_id, "values": values},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


def decode_entry(raw: bytes) -> tuple[QuotaEntity, dict[str, float]]:
    value: dict[str, Any] = json.loads(raw)
    user, client_id = value.get("user"), value.get("client_id")
    entity = QuotaEntity(None if user is None else str(user), None if client_id is None else str(client_id))
    validate_entity(entity)
    return entity, apply_alteration({}, list(dict(value["values"]).items()))


class QuotaCache:
    """Every quota entity, as of the cluster watch; waiters learn of each change (for streams)."""

    def __init__(self) -> None:
        #: etcd key -> (entity, values).
        self.entries: dict[str, tuple[QuotaEntity, dict[str, float]]] = {}
        self.version = 0
        self._changed = asyncio.Condition()

    def apply(self, batch: list[WatchEvent] | WatchResync) -> None:
        """A cluster-watch response (a batch listener of the metadata cache)."""
        before = self.version
        if isinstance(batch, WatchResync):
            self.entries = {}
            for kv in batch.kvs:
                if kv.key.startswith(QUOTAS):
                    self._put(kv.key, kv.value)
            self.version += 1
        else:
            for event in batch:
                if not event.kv.key.startswith(QUOTAS):
                    continue
                if event.type is EventType.PUT:
                    self._put(event.kv.key, event.kv.value)
                else:
                    self.entries.pop(event.kv.key, None)
                self.version = before + 1
        if self.version != before:
            asyncio.get_running_loop().create_task(self._notify())

    def _put(self, key: str, raw: bytes) -> None:
        try:
            self.entries[key] = decode_entry(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ignoring quota key %r with a bad value: %s", key, exc)
            self.entries.pop(key, None)

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

    def values_of(self, entity: QuotaEntity) -> dict[str, float]:
        found = self.entries.get(quota_key(entity))
        return dict(found[1]) if found is not None else {}

    def matching(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        return QuotaResolver(dict(self.entries.values())).matching(quota_filter)


def alter_ops(entity: QuotaEntity, values: dict[str, float]) -> list[Op]:
    """The write that leaves ``entity`` with ``values`` (none: its key deleted)."""
    key = quota_key(entity)
    return [Op.put(key, encode_entry(entity, values))] if values else [Op.delete(key)]
