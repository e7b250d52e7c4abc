"""The coordinator's etcd key layout and the JSON value of each key. Pure: no I/O.

Every key is relative to the cluster prefix ``/tributary/<cluster>/``:

==================================  ==========================================  ===================
key                                 value (JSON unless noted)                   lifetime
==================================  ==========================================  ===================
``brokers/<node_id>``               node_id, host, grpc_port, fetch_port, rack  storage node lease
``coordinators/<coordinator_id>``   coordinator_id, host, grpc_port             coordinator lease
``controller``                      coordinator_id, address, epoch              active's lease
``controller_epoch``                decimal integer (text)                      persistent
``cluster_id``                      text (a uuid4 hex)                          persistent
``topics/<topic>``                  topic_id, partitions, replication_factor,   persistent
                                    configs, assignment, deleting
``topics/<topic>/partitions/<p>``   replicas, leader, leader_epoch, isr, state  persistent
                                    (+ adding, removing, retired, throttle
                                    while a reassignment runs or cleans up)
==================================  ==========================================  ===================

Consumer groups live under ``groups/`` (members, generation and target, the ownership registry,
committed offsets), the transaction coordinator's state under ``transactions/`` and in
``producer_ids``; their layouts are in :mod:`coordinator.groups.keys` and
:mod:`coordinator.transactions.keys`, and the metadata state ignores those keys
(:func:`parse_key` calls them ``other``).

``topics/<topic>`` carries the replica assignment decided at create / add-partitions time (one
key, so creating a topic of any size is one atomic write, as Kafka's ``/brokers/topics/<t>``
znode). ``topics/<topic>/partitions/<p>`` is the partition's state, written by the controller
once the partition's leader has it (Kafka's ``.../partitions/<p>/state``); a partition without
that key is still PENDING.

Topic names cannot contain ``/`` (see :mod:`coordinator.topic_rules`), so key paths split
unambiguously. Decoders raise :class:`BadValueError` for values that are not what this module
writes; the cache logs and skips such keys rather than failing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.model import (
    ControllerInfo,
    CoordinatorInfo,
    PartitionRecord,
    PartitionStatus,
    RegisteredBroker,
    TopicRecord,
)
from services.cluster_keys import (  # noqa: F401 -- broker_key: part of the layout
    BROKERS,
    CONTROLLER,
    CONTROLLER_EPOCH,
    ControllerRecord,
    broker_key,
    decode_broker_record,
    decode_controller_epoch,
    encode_controller_epoch,
)

COORDINATORS = "coordinators/"
CLUSTER_ID = "cluster_id"
TOPICS = "topics/"
_PARTITIONS = "partitions"

#: Largest ``topics/<topic>`` value the controller writes. etcd refuses a request larger than its
#: ``--max-request-bytes`` (1.5 MiB by default); the rest of the transaction (keys, compares) is
#: small. A topic at the default partition limit (10,000) with replication factor 3 is ~170 KiB.
MAX_TOPIC_VALUE_BYTES = 1024 * 1024

#: Keys written per transaction (partition states, ACLs; a reassignment adds its topic record and
#: the controller its fencing compares): etcd allows 128 compares and 128 ops per txn.
WRITE_BATCH = 100


class BadValueError(ValueError):
    """A key's value is not in the format this module writes."""


def coordinator_key(coordinator_id: str) -> str:
    return f"{COORDINATORS}{coordinator_id}"


def topic_key(topic: str) -> str:
    return f"{TOPICS}{topic}"


def partitions_prefix(topic: str) -> str:
    """Prefix of every partition-state key of ``topic`` (with the trailing slash: exact topic)."""
    return f"{TOPICS}{topic}/{_PARTITIONS}/"


def partition_key(topic: str, partition: int) -> str:
    return f"{partitions_prefix(topic)}{partition}"


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """What a key names: ``kind`` is broker, coordinator, controller, controller_epoch,
    cluster_id, topic, partition or other; ``name`` the id/topic; ``partition`` for partitions."""

    kind: str
    name: str = ""
    partition: int = -1


def parse_key(key: str) -> ParsedKey:
    """Classify a relative key; unknown shapes are ``other`` (ignored by the cache)."""
    if key in (CONTROLLER, CONTROLLER_EPOCH, CLUSTER_ID):
        return ParsedKey(key)
    if key.startswith(BROKERS):
        return ParsedKey("broker", key[len(BROKERS) :])
    if key.startswith(COORDINATORS):
        return ParsedKey("coordinator", key[len(COORDINATORS) :])
    if key.startswith(TOPICS):
        parts = key[len(TOPICS) :].split("/")
        if len(parts) == 1 and parts[0]:
            return ParsedKey("topic", parts[0])
        if len(parts) == 3 and parts[1] == _PARTITIONS and parts[2].isdigit():
            return ParsedKey("partition", parts[0], int(parts[2]))
    return ParsedKey("other")


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


def _load(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadValueError("expected a JSON object")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _int(value: dict[str, Any], name: str, default: int | None = None) -> int:
    item = value.get(name, default)
    if isinstance(item, bool) or not isinstance(item, int):
        raise BadValueError(f"field {name!r} must be an integer, got {item!r}")
    return item


def _int_list(value: dict[str, Any], name: str) -> tuple[int, ...]:
    items = value.get(name, [])
    if not isinstance(items, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in items):
        raise BadValueError(f"field {name!r} must be a list of integers, got {items!r}")
    return tuple(items)


def decode_broker(raw: bytes, *, incarnation: int) -> RegisteredBroker:
    """A storage node's registration (``incarnation``: the key's create revision)."""
    try:
        record = decode_broker_record(raw)
    except ValueError as exc:
        raise BadValueError(str(exc)) from None
    return RegisteredBroker(
        record.node_id, record.host, record.grpc_port, record.fetch_port, record.rack, incarnation=incarnation
    )


def encode_coordinator(info: CoordinatorInfo) -> bytes:
    return _dump({"coordinator_id": info.coordinator_id, "host": info.host, "grpc_port": info.grpc_port})


def decode_coordinator(raw: bytes) -> CoordinatorInfo:
    value = _load(raw)
    return CoordinatorInfo(
        str(value.get("coordinator_id", "")), str(value.get("host", "")), _int(value, "grpc_port", 0)
    )


def encode_controller(info: ControllerInfo) -> bytes:
    return ControllerRecord(info.coordinator_id, info.address, info.epoch).encode()


def decode_controller(raw: bytes) -> ControllerInfo:
    try:
        record = ControllerRecord.decode(raw)
    except ValueError as exc:
        raise BadValueError(f"controller: {exc}") from None
    return ControllerInfo(record.coordinator_id, record.address, record.epoch)


def encode_epoch(epoch: int) -> bytes:
    return encode_controller_epoch(epoch)


def decode_epoch(raw: bytes) -> int:
    try:
        return decode_controller_epoch(raw)
    except ValueError as exc:
        raise BadValueError(str(exc)) from None


def encode_topic(topic: TopicRecord) -> bytes:
    return _dump(
        {
            "topic_id": topic.topic_id,
            "partitions": len(topic.assignment),
            "replication_factor": topic.replication_factor,
            "configs": dict(topic.configs),
            "assignment": [list(r) for r in topic.assignment],
            "deleting": topic.deleting,
        }
    )


def topic_value_bound(
    partitions: int, replication_factor: int, node_id_width: int, configs: Mapping[str, str]
) -> int:
    """The most bytes :func:`encode_topic` can write for a topic of this shape, without placing it:
    every node id at most ``node_id_width`` characters. Linear in nothing but ``configs``."""
    shape = {
        "topic_id": "0" * 32,
        "partitions": partitions,
        "replication_factor": replication_factor,
        "configs": dict(configs),
        "assignment": [],
        "deleting": False,
    }
    replica_list = 2 + replication_factor * (node_id_width + 1) - 1  # [1,2,3]
    return len(_dump(shape)) + partitions * (replica_list + 1)  # a comma after each


def decode_topic(name: str, raw: bytes, *, mod_revision: int = 0) -> TopicRecord:
    value = _load(raw)
    assignment = value.get("assignment")
    if not isinstance(assignment, list) or not assignment:
        raise BadValueError("field 'assignment' must be a non-empty list of replica lists")
    replicas = tuple(_int_list({"r": r}, "r") for r in assignment)
    if _int(value, "partitions", len(replicas)) != len(replicas):
        raise BadValueError("field 'partitions' does not match the assignment")
    configs = value.get("configs", {})
    if not isinstance(configs, dict):
        raise BadValueError("field 'configs' must be an object")
    return TopicRecord(
        name=name,
        topic_id=str(value.get("topic_id", "")),
        replication_factor=_int(value, "replication_factor", len(replicas[0])),
        configs={str(k): str(v) for k, v in configs.items()},
        assignment=replicas,
        deleting=bool(value.get("deleting", False)),
        mod_revision=mod_revision,
    )


def encode_partition(record: PartitionRecord) -> bytes:
    value: dict[str, Any] = {
        "replicas": list(record.replicas),
        "leader": record.leader,
        "leader_epoch": record.leader_epoch,
        "isr": list(record.isr),
        "state": record.status.value,
    }
    # Reassignment fields only while they say something: most partitions never move.
    for name in ("adding", "removing", "retired"):
        if getattr(record, name):
            value[name] = list(getattr(record, name))
    if record.throttle_bytes_per_s:
        value["throttle"] = record.throttle_bytes_per_s
    return _dump(value)


def decode_partition(raw: bytes, *, mod_revision: int = 0) -> PartitionRecord:
    value = _load(raw)
    try:
        status = PartitionStatus(value.get("state"))
    except ValueError:
        raise BadValueError(f"unknown partition state {value.get('state')!r}") from None
    return PartitionRecord(
        replicas=_int_list(value, "replicas"),
        leader=_int(value, "leader"),
        leader_epoch=_int(value, "leader_epoch"),
        isr=_int_list(value, "isr"),
        status=status,
        mod_revision=mod_revision,
        adding=_int_list(value, "adding"),
        removing=_int_list(value, "removing"),
        retired=_int_list(value, "retired"),
        throttle_bytes_per_s=_int(value, "throttle", 0),
    )
