"""Start, watch and stop Tributary service processes: the local cluster launcher's building block.

Each service writes a *ready file* (JSON with its pid and bound ports) once it serves; starting a
process means launching it with ``--ready-file`` and waiting for that file, so callers never
race a half-started service and ports can be 0 (picked by the OS). Used by ``tributary cluster``
and by every integration test, so tests run the same launch path users do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class ServiceStartError(RuntimeError):
    """A service process exited or did not become ready in time; carries its log tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ServiceProcess:
    """One service process started with :func:`start_service`."""

    name: str
    module: str
    args: list[str]
    ready_file: Path
    log_file: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    info: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, *, timeout: float = 30.0) -> dict:
        """Launch and wait until the ready file appears; returns its JSON."""
        self.ready_file.unlink(missing_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_file, "ab") as log:
            self.popen = subprocess.Popen(
                # The service logs to stderr and telemetry's console exporters print spans and
                # metrics to stdout (OTEL_TRACES_EXPORTER=console): both land in log_file, once
                # each -- services are not given --log-file, so nothing writes the file twice.
                [sys.executable, "-m", self.module, *self.args, "--ready-file", str(self.ready_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the launcher's terminal does not hit the services
            )
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with status {self.popen.returncode} before it was ready; "
                    f"log {self.log_file}:\n{log_tail(self.log_file)}"
                )
            if self.ready_file.exists():
                try:
                    self.info = json.loads(self.ready_file.read_text())
                    return self.info
                except ValueError:
                    pass  # written atomically, but be lenient about a foreign writer
            time.sleep(0.05)
        raise ServiceStartError(
            f"{self.name} not ready after {timeout}s; log {self.log_file}:\n{log_tail(self.log_file)}"
        )

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.is_running():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """``kill -9``: no cleanup runs (the crash tests' tool)."""
        popen = self.popen
        if popen is not None and popen.poll() is None:  # is_running()
            popen.kill()
            popen.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (graceful shutdown); SIGKILL after ``timeout``."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode

    def restart(self, *, timeout: float = 30.0) -> dict:
        self.stop()
        return self.start(timeout=timeout)


def start_service(
    name: str,
    module: str,
    args: list[str],
    run_dir: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> ServiceProcess:
    """Start ``python -m module args`` with a ready file and log in ``run_dir``; wait until ready."""
    run_dir.mkdir(parents=True, exist_ok=True)
    process = ServiceProcess(
        name=name,
        module=module,
        args=list(args),
        ready_file=run_dir / f"{name}.ready.json",
        log_file=run_dir / f"{name}.log",
        env=dict(env or {}),
    )
    process.start(timeout=timeout)
    return process
