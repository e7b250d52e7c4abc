"""Client quotas: who they apply to, what they say, and which one applies (Kafka's rules). Pure.

A quota is set on an *entity*: a user (the principal's name, ``alice`` for ``User:alice``), a
client id (Kafka's ``client.id``), or a user and a client id together. Either part may be the
*default* (``<default>``, Kafka's name for it), which stands for every user (or client id) that
has no entity of its own. Each entity holds values for some of three keys:

* ``producer_byte_rate`` -- bytes per second the entity's produce requests may send (KIP-13);
* ``consumer_byte_rate`` -- bytes per second its fetch answers may carry;
* ``request_percentage`` -- the share of the gateway's time its requests may take, in percent of
  one event loop (KIP-124; 100 = the whole loop).

Which entity's value applies to a client (user *U*, client id *C*) is decided per key: the first
of these entities that sets the key, in Kafka's order (``docs/ops.html#design_quotas``)::

    1. user U,         client C            5. user <default>, client <default>
    2. user U,         client <default>    6. user <default>
    3. user U                              7. client C
    4. user <default>, client C            8. client <default>

The entity found also says who shares the allowance (the *sensor key*): a quota set on a name
is shared by everyone matching that name, one set on ``<default>`` is given to each user (or
client id) separately, and a part the entity lacks is shared across it. So ``user alice`` is one
allowance for all of alice's clients, ``client <default>`` one per client id.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

#: The name of a default entity part, as Kafka stores it (``/config/users/<default>``).
DEFAULT = "<default>"
USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
#: Keys whose values are whole bytes per second (Kafka's LONG quota configs).
_BYTE_RATES = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)

#: The longest user or client id name an entity may carry (as ACL fields).
MAX_NAME_LENGTH = 1024
#: The principal prefix a user's name is taken from (``User:alice`` -> ``alice``).
_USER_PREFIX = "User:"


class QuotaType(Enum):
    """What a quota meters, named by its key."""

    PRODUCE = PRODUCER_BYTE_RATE
    FETCH = CONSUMER_BYTE_RATE
    REQUEST = REQUEST_PERCENTAGE


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """``user`` and ``client_id``: a name, :data:`DEFAULT`, or None when the entity has no such
    part (``QuotaEntity(user="alice")`` is the user alice with any client id)."""

    user: str | None = None
    client_id: str | None = None

    def parts(self) -> dict[str, str]:
        """``{entity type: name}`` of the parts it has."""
        found = {}
        if self.user is not None:
            found[USER] = self.user
        if self.client_id is not None:
            found[CLIENT_ID] = self.client_id
        return found

    def __str__(self) -> str:
        return ", ".join(f"{kind}={name}" for kind, name in self.parts().items()) or "(none)"


class SensorKey(NamedTuple):
    """Who shares one allowance: the user and client id it is metered for ("" = shared across)."""

    user: str
    client_id: str


class ResolvedQuota(NamedTuple):
    """The quota that applies to a client for one key: the entity it was set on, its bound, and
    whose requests are metered together."""

    entity: QuotaEntity
    limit: float
    sensor: SensorKey


def user_of(principal: str) -> str:
    """The user name of a principal (``User:alice`` -> ``alice``), as quota entities name users."""
    return principal[len(_USER_PREFIX) :] if principal.startswith(_USER_PREFIX) else principal


# ---- validation --------------------------------------------------------------------------


def validate_entity(entity: QuotaEntity) -> None:
    """ValueError for an entity no client could ever match."""
    parts = entity.parts()
    if not parts:
        raise ValueError("a quota entity needs a user, a client id, or both")
    for kind, name in parts.items():
        if not name:
            raise ValueError(f"the {kind} of a quota entity must be a name or {DEFAULT}, not empty")
        if len(name) > MAX_NAME_LENGTH:
            raise ValueError(f"the {kind} of a quota entity is at most {MAX_NAME_LENGTH} characters")


def validate_quota_value(key: str, value: float) -> float:
    """The value as stored (byte rates as whole numbers); ValueError naming the key otherwise."""
    if key not in QUOTA_KEYS:
        raise ValueError(f"unknown quota key {key!r} (known: {', '.join(QUOTA_KEYS)})")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, not {value!r}")
    if value <= 0:
        raise ValueError(f"{key} must be positive, not {value:g} (remove the key to lift the quota)")
    if key in _BYTE_RATES:
        if value != int(value):
            raise ValueError(f"{key} is a whole number of bytes per second, not {value:g}")
        return float(int(value))
    return float(value)


# ---- describe filters (KIP-546) ----------------------------------------------------------


class MatchType(Enum):
    EXACT = "EXACT"  #: the part is this name
    DEFAULT = "DEFAULT"  #: the part is <default>
    SPECIFIED = "SPECIFIED"  #: the part is any name but <default>


@dataclass(frozen=True, slots=True)
class ComponentFilter:
    entity_type: str
    match: MatchType
    name: str = ""

    def matches(self, name: str | None) -> bool:
        if name is None:
            return False
        if self.match is MatchType.EXACT:
            return name == self.name
        if self.match is MatchType.DEFAULT:
            return name == DEFAULT
        return name != DEFAULT


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    """Entities whose parts match every component; with ``strict``, also without other parts."""

    components: tuple[ComponentFilter, ...] = ()
    strict: bool = False

    def matches(self, entity: QuotaEntity) -> bool:
        parts = entity.parts()
        if self.strict and set(parts) != {c.entity_type for c in self.components}:
            return False
        return all(c.matches(parts.get(c.entity_type)) for c in self.components)


def validate_filter(quota_filter: QuotaFilter) -> None:
    seen = set()
    for component in quota_filter.components:
        if component.entity_type not in ENTITY_TYPES:
            raise ValueError(
                f"unknown entity type {component.entity_type!r} (known: {', '.join(ENTITY_TYPES)})"
            )
        if component.entity_type in seen:
            raise ValueError(f"entity type {component.entity_type} appears twice in the filter")
        seen.add(component.entity_type)
        if component.match is MatchType.EXACT and not component.name:
            raise ValueError(f"an EXACT match on {component.entity_type} needs a name")


# ---- resolution --------------------------------------------------------------------------


def candidate_entities(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """The entities that may hold a quota for (user, client id), in Kafka's precedence order."""
    return (
        QuotaEntity(user, client_id),
        QuotaEntity(user, DEFAULT),
        QuotaEntity(user, None),
        QuotaEntity(DEFAULT, client_id),
        QuotaEntity(DEFAULT, DEFAULT),
        QuotaEntity(DEFAULT, None),
        QuotaEntity(None, client_id),
        QuotaEntity(None, DEFAULT),
    )


def sensor_key(entity: QuotaEntity, user: str, client_id: str) -> SensorKey:
    """Whose requests share the allowance set on ``entity``: a part the entity has is metered per
    user (or client id); one it lacks is shared."""
    return SensorKey(
        user if entity.user is not None else "", client_id if entity.client_id is not None else ""
    )


class QuotaResolver:
    """Which quota applies to whom, over a fixed set of entities (build a new one on change)."""

    def __init__(self, configs: Mapping[QuotaEntity, Mapping[str, float]] | None = None) -> None:
        self.configs: dict[QuotaEntity, dict[str, float]] = {
            entity: dict(values) for entity, values in (configs or {}).items() if values
        }
        #: Keys some entity sets: a key nobody sets needs no lookup at all.
        self.keys_in_use = frozenset(key for values in self.configs.values() for key in values)

    def resolve(self, key: str, user: str, client_id: str) -> ResolvedQuota | None:
        """The quota on ``key`` for a client, or None when no entity sets it for this client."""
        if key not in self.keys_in_use:
            return None
        for entity in candidate_entities(user, client_id):
            values = self.configs.get(entity)
            if values is not None and key in values:
                return ResolvedQuota(entity, values[key], sensor_key(entity, user, client_id))
        return None

    def matching(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        return sorted(
            ((e, dict(v)) for e, v in self.configs.items() if quota_filter.matches(e)),
            key=lambda item: (item[0].user or "", item[0].client_id or ""),
        )


def apply_alteration(
    current: Mapping[str, float], changes: Iterable[tuple[str, float | None]]
) -> dict[str, float]:
    """An entity's values after ``changes`` (key, new value or None to remove), each validated."""
    values = dict(current)
    seen = set()
    for key, value in changes:
        if key in seen:
            raise ValueError(f"quota key {key} appears twice for one entity")
        seen.add(key)
        if value is None:
            if key not in QUOTA_KEYS:
                raise ValueError(f"unknown quota key {key!r} (known: {', '.join(QUOTA_KEYS)})")
            values.pop(key, None)
        else:
            values[key] = validate_quota_value(key, value)
    return values
