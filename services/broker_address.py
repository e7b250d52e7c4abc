"""``BrokerAddress``: where a storage node (Kafka's broker) serves. Pure.

One type for every side that needs to reach a storage node: its registration in etcd
(``brokers/<id>``, :mod:`services.cluster_keys`), the coordinator's view of live nodes (which adds
the registration's incarnation, ``coordinator.model.RegisteredBroker``), the gateway's routes to
partition leaders, and a follower's leader (whose fetch port it replicates from). The wire forms
are ``BrokerInfo`` and ``ReplicaEndpoint`` (``services.serde`` converts the former).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A storage node's id, host, gRPC port (the StorageNode service), fetch port (the raw TCP
    port of :mod:`services.fetchport`) and rack. A port a message did not carry is 0."""

    node_id: int
    host: str
    grpc_port: int = 0
    fetch_port: int = 0
    #: The failure domain for rack-aware placement (Kafka's broker.rack); empty = none.
    rack: str = ""

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the node's gRPC service, as a channel target."""
        return f"{self.host}:{self.grpc_port}"
