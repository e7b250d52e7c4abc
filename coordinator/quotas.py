"""Client quotas as the coordinator keeps them: one etcd key per entity, a cache fed by the
cluster watch, and the admin writes (the active controller's fenced transactions).

Layout: ``quotas/<id>`` -> ``{"user": .., "client_id": .., "values": {key: value}}`` as JSON,
``<id>`` a hash of the entity (user and client id names may hold any character, so they are not
spelled into the key). An entity whose last key is removed has its key deleted. Every
coordinator's cache follows the keys (``WatchClientQuotas`` streams it to gateways, which
enforce); writes go through the active controller, so a deposed one writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from coordinator.watched_keys import WatchedKeys
from services.etcd.txn import Op
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


class QuotaCache(WatchedKeys[tuple[QuotaEntity, dict[str, float]]]):
    """Every quota entity, as of the cluster watch (``entries``: etcd key -> (entity, values))."""

    def __init__(self) -> None:
        super().__init__(QUOTAS, decode_entry, "quota")

    def values_of(self, entity: QuotaEntity) -> dict[str, float]:
        found = self.entries.get(quota_key(entity))
        return dict(found[1]) if found is not None else {}

    def matching(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        return QuotaResolver(dict(self.entries.values())).matching(quota_filter)


def alter_ops(entity: QuotaEntity, values: dict[str, float]) -> list[Op]:
    """The write that leaves ``entity`` with ``values`` (none: its key deleted)."""
    key = quota_key(entity)
    return [Op.put(key, encode_entry(entity, values))] if values else [Op.delete(key)]
