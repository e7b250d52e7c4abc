"""The etcd keys that two services share: the cluster prefix, a storage node's registration
(``brokers/<node_id>``), which the storage node writes and the coordinator reads, and the active
controller (``controller``, ``controller_epoch``), which the coordinator writes and storage nodes
read (to send AlterPartition and to refuse a deposed controller's calls). Pure: no I/O.

Kept here, once, because it is a contract between two services that may not import each other:
a field renamed on one side only would make every node look unregistered to the controller. The
rest of the layout is the coordinator's alone (``coordinator/keys.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.broker_address import BrokerAddress

BROKERS = "brokers/"
CONTROLLER = "controller"
CONTROLLER_EPOCH = "controller_epoch"


def cluster_prefix(cluster: str) -> str:
    """The etcd key prefix of a Tributary cluster: ``/tributary/<cluster>/`` (every service's keys
    live under it, so several clusters can share one etcd)."""
    return f"/tributary/{cluster}/"


def broker_key(node_id: int) -> str:
    """The registration key of storage node ``node_id`` (relative to the cluster prefix)."""
    return f"{BROKERS}{node_id}"


def encode_broker_record(address: BrokerAddress) -> str:
    """The JSON value at ``brokers/<node_id>``: where a live storage node serves."""
    fields = ("node_id", "host", "grpc_port", "fetch_port", "rack")  # not a subclass's extras
    return json.dumps({name: getattr(address, name) for name in fields}, sort_keys=True)


def decode_broker_record(raw: bytes | str) -> BrokerAddress:
    """Raises ValueError for a value that is not what :func:`encode_broker_record` writes."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return BrokerAddress(
        node_id=_int(value, "node_id"),
        host=str(value.get("host", "")),
        grpc_port=_int(value, "grpc_port", 0),
        fetch_port=_int(value, "fetch_port", 0),
        rack=str(value.get("rack") or ""),
    )


def _int(value: dict, name: str, default: int | None = None) -> int:
    item = value.get(name, default)
    if isinstance(item, bool) or not isinstance(item, int):
        raise ValueError(f"field {name!r} must be an integer, got {item!r}")
    return item


@dataclass(frozen=True, slots=True)
class ControllerRecord:
    """The JSON value at ``controller``: the active controller and the epoch it was elected with."""

    coordinator_id: str
    address: str
    epoch: int

    def encode(self) -> bytes:
        return json.dumps(
            {"coordinator_id": self.coordinator_id, "address": self.address, "epoch": self.epoch},
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> ControllerRecord:
        """Raises ValueError for a value that is not what :meth:`encode` writes."""
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object")
        return cls(str(value.get("coordinator_id", "")), str(value.get("address", "")), _int(value, "epoch"))


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(raw: bytes) -> int:
    """Raises ValueError unless ``raw`` is a decimal integer."""
    text = raw.decode(errors="replace").strip()
    if not text.isdigit():
        raise ValueError(f"controller epoch must be a decimal integer, got {text!r}")
    return int(text)
