"""The EmbeddedEtcd launcher: restart on the same endpoint, crash recovery, clear start errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from services.etcd import EmbeddedEtcd, EmbeddedEtcdError, EtcdClient

from ._support import run

REPO_ROOT = Path(__file__).resolve().parents[3]


async def _put(endpoint: str, key: str, value: str) -> None:
    async with EtcdClient(endpoint) as client:
        await client.put(key, value)


async def _get(endpoint: str, key: str) -> bytes | None:
    async with EtcdClient(endpoint) as client:
        kv = await client.get(key)
        return kv.value if kv else None


def test_restart_and_kill_keep_endpoint_and_data(etcd_factory: Callable[..., EmbeddedEtcd]) -> None:
    server = etcd_factory()
    endpoint, pid = server.endpoint, server.pid
    run(_put(endpoint, "k", "v1"))
    server.restart()
    assert server.endpoint == endpoint and server.pid != pid
    assert run(_get(endpoint, "k")) == b"v1"
    run(_put(endpoint, "k", "v2"))
    server.kill()  # a crash: no graceful shutdown
    assert not server.is_running
    server.start()
    assert run(_get(endpoint, "k")) == b"v2"


def test_a_failed_start_says_why(tmp_path: Path) -> None:
    server = EmbeddedEtcd(tmp_path / "etcd", extra_args=("--no-such-flag",), start_timeout=5.0)
    with pytest.raises(EmbeddedEtcdError) as failure:
        server.start()
    assert "no-such-flag" in str(failure.value)
    assert not server.is_running


def test_module_entry_point_runs_until_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.etcd.embedded",
            "--data-dir",
            str(tmp_path / "etcd"),
            "--client-port",
            "0",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "ready at 127.0.0.1:" in line, line + (
            process.stderr.read() if process.stderr is not None and process.poll() else ""
        )
        endpoint = line.split("ready at ")[1].split()[0]
        assert run(_get(endpoint, "missing")) is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
