"""Fixtures for storage node tests: real node processes, a gRPC stub and a fetch client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc
import pytest

from launcher.processes import ServiceProcess, start_service
from services.fetchport.client import FetchClient
from services.proto import pb, storage_grpc
from services.records import RecordBatchBuilder


class NodeHandle:
    """A running storage node process with a sync gRPC stub and helpers."""

    def __init__(self, process: ServiceProcess) -> None:
        self.process = process
        self.connect()

    def connect(self) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.process.info['grpc_port']}")
        self.stub = storage_grpc.StorageNodeStub(self.channel)

    @property
    def fetch_port(self) -> int:
        return self.process.info["fetch_port"]

    def restart(self) -> None:
        self.channel.close()
        self.process.start()
        self.connect()

    def create(self, topic: str, partition: int = 0, **configs: str) -> None:
        self.stub.CreatePartition(
            pb.CreatePartitionRequest(topic=topic, partition=partition, configs=configs)
        )

    def append(self, topic: str, partition: int, data: bytes, acks=pb.ACKS_ALL):
        response = self.stub.Append(
            pb.AppendRequest(
                partitions=[pb.PartitionAppend(topic=topic, partition=partition, record_batches=data)],
                acks=acks,
            )
        )
        return response.partitions[0]

    def describe(self, topic: str, partition: int = 0):
        response = self.stub.DescribePartitions(
            pb.DescribePartitionsRequest(partitions=[pb.TopicPartition(topic=topic, partition=partition)])
        )
        return response.partitions[0]

    def fetch(self, topic: str, partition: int, offset: int, **kwargs):
        async def go():
            client = FetchClient("127.0.0.1", self.fetch_port)
            try:
                return await client.fetch(topic, partition, offset, **kwargs)
            finally:
                await client.close()

        return asyncio.run(go())

    def close(self) -> None:
        self.channel.close()


def make_batch(values, *, key_prefix=b"k", timestamp=None, compression=None, headers=()) -> bytes:
    kwargs = {} if compression is None else {"compression": compression}
    builder = RecordBatchBuilder(**kwargs)
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    for i, value in enumerate(values):
        builder.append(value, timestamp=ts + i, key=key_prefix + str(i).encode(), headers=headers)
    return builder.build()


def start_node(tmp_path, name="node", *extra: str) -> NodeHandle:
    process = start_service(
        name,
        "storage_node.main",
        ["--node-id", "0", "--log-dirs", str(tmp_path / f"{name}-data"), "--standalone", "true", *extra],
        tmp_path / "run",
    )
    return NodeHandle(process)


def start_node_wrapped(tmp_path, name: str, wrapper: list[str], *args: str) -> NodeHandle:
    """A node launched through ``wrapper`` (``prlimit ...``, ``unshare ...``), which must end by
    exec'ing the command it is given, so the process is the node. ``args`` are the node's flags."""
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    process = ServiceProcess(
        name=name,
        module="storage_node.main",
        args=["--node-id", "0", "--standalone", "true", *args],
        ready_file=run / f"{name}.ready.json",
        log_file=run / f"{name}.log",
    )
    command = [sys.executable, "-m", process.module, *process.args, "--ready-file", str(process.ready_file)]
    with open(process.log_file, "ab") as log:
        process.popen = subprocess.Popen(
            [*wrapper, *command],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    process.wait_ready()
    return NodeHandle(process)


@pytest.fixture
def node(tmp_path):
    handle = start_node(tmp_path)
    yield handle
    handle.close()
    handle.process.stop()
