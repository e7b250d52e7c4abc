"""A storage node whose data directory is a real, full file system (issue item 7).

The node runs in its own user and mount namespace (``unshare -rm``, no root needed) with its log
dir on a 1 MiB tmpfs; the test fills that tmpfs through ``/proc/<pid>/root`` until ENOSPC.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import grpc
import pytest

from services import errors
from services.proto import pb

from .conftest import NodeHandle, make_batch, start_node_wrapped

TMPFS_SIZE = "1m"


def _start_node_on_tmpfs(tmp_path: Path) -> tuple[NodeHandle, Path]:
    """A node whose log dir is on a fresh tmpfs; returns it and the log dir as seen from here."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "{disk}" && exec "$@"'
    wrapper = [shutil.which("unshare") or "unshare", "-rm", "sh", "-c", script, "sh"]
    node = start_node_wrapped(tmp_path, "full", wrapper, "--log-dirs", str(disk / "data"))
    # The tmpfs is visible only inside the node's mount namespace: reach it through its root.
    return node, Path(f"/proc/{node.process.pid}/root") / disk.relative_to("/") / "data"


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    # Smaller writes until not even one page is left.
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def full_node(tmp_path):
    node, data_dir = _start_node_on_tmpfs(tmp_path)
    yield node, data_dir
    node.close()
    node.process.stop()


def test_create_partition_retries_on_a_full_disk_leak_no_descriptor(full_node):
    node, data_dir = full_node
    node.create("before")  # a partition made while there was room
    filler = _fill(data_dir)
    baseline = _open_fds(node.process.pid)
    failures: list[grpc.RpcError] = []
    done = threading.Event()

    def retry_create():
        for _ in range(50):
            try:
                node.create("full")
            except grpc.RpcError as exc:
                failures.append(exc)
        done.set()

    retrier = threading.Thread(target=retry_create)
    retrier.start()
    # Meanwhile another client's calls answer promptly.
    other = grpc.insecure_channel(f"127.0.0.1:{node.process.info['grpc_port']}")
    describe = other.unary_unary(
        "/tributary.v1.StorageNode/DescribeLogDirs",
        request_serializer=pb.DescribeLogDirsRequest.SerializeToString,
        response_deserializer=pb.DescribeLogDirsResponse.FromString,
    )
    while not done.is_set():
        started = time.monotonic()
        response = describe(pb.DescribeLogDirsRequest(), timeout=5)
        assert time.monotonic() - started < 1.0
        assert [p.topic for d in response.log_dirs for p in d.partitions] == ["before"]
    retrier.join(30)
    other.close()

    assert len(failures) == 50
    for exc in failures:  # a clear, retriable storage error, not UNKNOWN
        assert exc.code() == grpc.StatusCode.UNAVAILABLE
        error = errors.error_from_rpc(exc)
        assert isinstance(error, errors.KafkaStorageError) and "No space left" in error.message
    assert _open_fds(node.process.pid) <= baseline
    # The partition made before still serves reads; once there is room again, the create works.
    assert node.fetch("before", 0, 0).header.error() is None
    filler.unlink()
    node.create("full")
    assert not node.append("full", 0, make_batch([b"room again"])).HasField("error")
    assert node.describe("full").log_end_offset == 1
