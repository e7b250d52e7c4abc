"""Immutable value types handed out by :mod:`services.etcd` instead of raw protobuf messages.

Keys are ``str`` relative to the client's key prefix (all Tributary keys are UTF-8 paths such as
``topics/orders/0``); values are ``bytes``. Revisions are etcd's store revisions: one counter for
the whole cluster, bumped by every write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it.

    ``create_revision``: revision of the write that created the key (since its last deletion);
    ``mod_revision``: revision of its last write; ``version``: writes since creation (1 = just
    created); ``lease``: the attached lease id, 0 for none.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class EventType(enum.Enum):
    """What happened to a key. An expired lease shows up as a DELETE of each attached key."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch.

    For a DELETE, ``kv`` holds the key with an empty value and ``mod_revision`` set to the
    revision of the deletion. ``prev_kv`` is the key before the change, if the watch asked for it.
    """

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class WatchResync:
    """The complete state of the watched range at ``revision``: replace, do not merge.

    A watch yields one first when it was opened with a snapshot, and again when the revision it
    had to resume from was compacted away (``compact_revision`` is then etcd's compaction point),
    so events were lost and the consumer must rebuild its state from ``kvs``. Events that follow
    have revisions above ``revision``.
    """

    kvs: tuple[KeyValue, ...]
    revision: int
    compact_revision: int = 0


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    """Maintenance status of the member behind one endpoint (used for health checks)."""

    endpoint: str
    version: str
    member_id: int
    leader: int
    revision: int
    raft_term: int
    raft_index: int
    raft_applied_index: int
    db_size: int
    db_size_in_use: int
    is_learner: bool
    errors: tuple[str, ...]

    @property
    def has_leader(self) -> bool:
        return self.leader != 0
