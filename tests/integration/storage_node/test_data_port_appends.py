"""Appends on the storage node's data port (``services/fetchport/append.py``) against a real node
process: the acks levels, leader-epoch fencing, order under pipelining, and bad input that never
changes a stored byte nor stops another client."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import pytest

from services import errors
from services.acks import Acks
from services.fetchport import append
from services.proto import pb
from services.records import iter_batches
from tests.support.wait import wait_until

from .conftest import make_batch

RESPONSIVE_S = 2.0


class PortClient:
    """A blocking data-port client for tests: send frames, read answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._next_id = 0

    def send(self, topic: str, partition: int, data: bytes, *, acks=Acks.LEADER, leader_epoch=-1) -> int:
        self._next_id += 1
        request = append.AppendRequest(
            self._next_id, acks, 5000, (append.PartitionAppend(topic, partition, data, leader_epoch),)
        )
        self.sock.sendall(append.encode_request(request))
        return self._next_id

    def read(self) -> append.AppendResponse:
        (size,) = struct.unpack(">i", self.sock.recv(4, socket.MSG_WAITALL))
        body = self.sock.recv(size, socket.MSG_WAITALL)
        assert len(body) == size
        if append.response_correlation_id(body) == append.CONNECTION_ERROR_ID:
            return append.AppendResponse(-1, append.connection_error(body), ())
        return append.decode_response_body(body)

    def append(self, topic: str, partition: int, data: bytes, **kwargs):
        correlation_id = self.send(topic, partition, data, **kwargs)
        response = self.read()
        assert response.correlation_id == correlation_id
        (result,) = response.results
        return result

    def closed(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def port(node):
    client = PortClient(node.fetch_port)
    yield client
    client.close()


def _values(node, topic: str, partition: int = 0) -> list[bytes | None]:
    out: list[bytes | None] = []
    offset = 0
    while True:
        response = node.fetch(topic, partition, offset, max_bytes=1 << 20)
        if not response.records:
            return out
        for batch in iter_batches(response.records):
            out.extend(r.value for r in batch.records())
            offset = batch.base_offset + batch.last_offset_delta + 1


def _partition_files(node, topic: str) -> dict[str, bytes]:
    root = Path(node.process.args[node.process.args.index("--log-dirs") + 1])
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.glob(f"{topic}-*/*"))
        if path.suffix in (".log", ".index", ".timeindex")
    }


@pytest.mark.parametrize("acks", [Acks.NONE, Acks.LEADER, Acks.ALL])
def test_appends_at_every_acks_level_are_written_and_answered(node, port, acks):
    node.create("t")
    first = port.append("t", 0, make_batch([b"a", b"b"]), acks=acks)
    second = port.append("t", 0, make_batch([b"c"]), acks=acks)
    assert first.error is None and second.error is None
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 1, 2)
    assert (second.base_offset, second.last_offset) == (2, 2)
    assert first.log_start_offset == 0
    assert _values(node, "t") == [b"a", b"b", b"c"]


def test_a_probe_is_answered_empty(node, port):
    port.sock.sendall(append.probe(41))
    response = port.read()
    assert (response.correlation_id, response.error, response.results) == (41, None, ())


def test_leader_epoch_is_checked_and_a_fenced_append_writes_nothing(node, port):
    node.stub.CreatePartition(pb.CreatePartitionRequest(topic="fenced", partition=0, leader_epoch=3))
    assert port.append("fenced", 0, make_batch([b"ok"]), leader_epoch=3).error is None
    stale = port.append("fenced", 0, make_batch([b"stale"]), leader_epoch=2)
    assert isinstance(stale.error, errors.FencedLeaderEpochError)
    ahead = port.append("fenced", 0, make_batch([b"ahead"]), leader_epoch=4)
    assert isinstance(ahead.error, errors.UnknownLeaderEpochError)
    missing = port.append("nowhere", 0, make_batch([b"x"]))
    assert isinstance(missing.error, errors.UnknownTopicOrPartitionError)
    assert _values(node, "fenced") == [b"ok"]


def test_pipelined_appends_of_a_partition_keep_their_order(node, port):
    for p in range(3):
        node.create("order", p)
    count = 300
    sent = {}
    frames = []
    for i in range(count):
        partition = i % 3
        request = append.AppendRequest(
            i,
            Acks.ALL if i % 2 else Acks.LEADER,
            5000,
            (append.PartitionAppend("order", partition, make_batch([b"%d" % i])),),
        )
        sent[i] = partition
        frames.append(append.encode_request(request))
    port.sock.sendall(b"".join(frames))  # all in flight at once
    answers = {}
    for _ in range(count):
        response = port.read()
        (result,) = response.results
        assert result.error is None
        answers[response.correlation_id] = result.base_offset
    assert sorted(answers) == list(range(count))
    traffic = _traffic(node)
    assert (traffic.data_port_appends, traffic.data_port_append_connections) == (count, 1)
    for p in range(3):
        mine = [i for i in range(count) if sent[i] == p]
        assert [answers[i] for i in mine] == list(range(len(mine)))  # offsets in request order
        assert _values(node, "order", p) == [b"%d" % i for i in mine]


def test_a_corrupt_batch_is_a_partition_error_and_the_connection_goes_on(node, port):
    node.create("c")
    batch = bytearray(make_batch([b"v"]))
    batch[-1] ^= 0xFF  # CRC mismatch
    bad = port.append("c", 0, bytes(batch))
    assert isinstance(bad.error, errors.CorruptRecordError)
    assert port.append("c", 0, make_batch([b"good"])).error is None
    assert _values(node, "c") == [b"good"]


def _assert_other_client_appends(node, topic: str) -> None:
    other = PortClient(node.fetch_port)
    try:
        started = time.monotonic()
        assert other.append(topic, 0, make_batch([b"other"])).error is None
        assert time.monotonic() - started < RESPONSIVE_S
    finally:
        other.close()


BAD_FRAMES = {
    "garbage": os.urandom(64),
    "huge length prefix": struct.pack(">ih", 0x7FFFFFFF, append.APPEND_VERSION) + b"\x00" * 16,
    "unknown version after an append": None,  # built in the test
    "negative size": struct.pack(">i", -5),
    "bad body": struct.pack(">ih", 20, append.APPEND_VERSION) + b"\xff" * 18,
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frames_are_refused_without_touching_stored_data(node, case):
    node.create("keep")
    writer = PortClient(node.fetch_port)
    assert writer.append("keep", 0, make_batch([b"kept"])).error is None
    before = _partition_files(node, "keep")
    bad = PortClient(node.fetch_port)
    if case == "unknown version after an append":
        assert bad.append("keep", 0, make_batch([b"x"])).error is None
        before = _partition_files(node, "keep")
        frame = append.encode_request(append.AppendRequest(1, Acks.LEADER, 0, ()))
        bad.sock.sendall(frame[:4] + struct.pack(">h", 9) + frame[6:])
    else:
        bad.sock.sendall(BAD_FRAMES[case])
    bad.sock.settimeout(5)
    # An error frame when the bytes could be framed, then the connection is closed.
    try:
        (size,) = struct.unpack(">i", bad.sock.recv(4, socket.MSG_WAITALL))
        body = bad.sock.recv(size, socket.MSG_WAITALL)
        assert append.response_correlation_id(body) == -1
        assert isinstance(
            append.connection_error(body), errors.InvalidRequestError | errors.UnsupportedVersionError
        )
    except (struct.error, ConnectionError):
        pass  # closed without an answer
    assert bad.closed()
    bad.close()
    if case not in ("negative size", "garbage", "huge length prefix"):  # refused before it
        assert _traffic(node).data_port_append_errors == 1
    assert _partition_files(node, "keep") == before
    assert writer.append("keep", 0, make_batch([b"still"])).error is None
    writer.close()
    _assert_other_client_appends(node, "keep")


def test_a_truncated_frame_writes_nothing_and_a_stalled_client_does_not_block_others(node):
    node.create("stall")
    frame = append.encode_request(
        append.AppendRequest(1, Acks.LEADER, 0, (append.PartitionAppend("stall", 0, make_batch([b"half"])),))
    )
    stalled = PortClient(node.fetch_port)
    stalled.sock.sendall(frame[: len(frame) // 2])  # and stalls mid-frame
    _assert_other_client_appends(node, "stall")
    stalled.close()  # truncated for good
    _assert_other_client_appends(node, "stall")
    assert _values(node, "stall") == [b"other", b"other"]


def test_a_thousand_half_open_connections_do_not_stop_appends(node):
    node.create("many")
    before = _traffic_memory(node)
    socks = []
    header = struct.pack(">ih", 64 << 20, append.APPEND_VERSION)  # announces 64 MiB, sends 16
    try:
        for _ in range(1000):
            sock = socket.create_connection(("127.0.0.1", node.fetch_port), timeout=10)
            sock.sendall(header + b"\x00" * 16)
            socks.append(sock)
        wait_until(
            lambda: _traffic(node).fetch_connections >= 1000, timeout=10, what="1,000 connections open"
        )
        _assert_other_client_appends(node, "many")
        grown = _traffic_memory(node) - before
        assert grown < 256 << 20, f"the node grew {grown >> 20} MiB for 1,000 stalled frames"
    finally:
        for sock in socks:
            sock.close()
    _assert_other_client_appends(node, "many")
    assert _values(node, "many") == [b"other", b"other"]


def _traffic(node) -> pb.NodeTraffic:
    return node.stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=5).traffic


def _traffic_memory(node) -> int:
    """The node process's resident bytes."""
    fields = Path(f"/proc/{node.process.popen.pid}/statm").read_text().split()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
