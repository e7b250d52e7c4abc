"""The fetch port's bounds against real node processes (issue item 5).

Reproduction: ~21,000 idle fetch-port connections took every descriptor of a node, after which
gRPC connections, partition creation and segment rolls failed; ``max_wait_ms`` up to 2^31-1 was
honoured, and a long poll outlived its client. Each test makes one of these happen and checks
the bound, and that another client's fetch and admin calls answer within a second meanwhile.
"""

from __future__ import annotations

import select
import socket
import struct
import time

import grpc
import pytest

from services import errors
from services.fetchport import protocol
from services.proto import pb
from storage_node.descriptors import DescriptorBudget, resolve_max_open_segments
from storage_node.fetch.server import DEFAULT_MAX_CONNECTIONS_PER_IP
from tests.support.wait import wait_until

from .conftest import make_batch, start_node, start_node_wrapped

RESPONSIVE_S = 1.0


def _traffic(node) -> pb.NodeTraffic:
    return node.stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=5).traffic


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _readable(sock: socket.socket, timeout: float = 0.0) -> bool:
    poller = select.poll()  # not select(): the test holds descriptors above 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _read_frame(sock: socket.socket) -> protocol.FetchResponseHeader:
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    body = sock.recv(size, socket.MSG_WAITALL)
    return protocol.decode_response_header(body[: protocol.response_prefix_length(body)], size)


def _assert_refused(sock: socket.socket, cap: str) -> None:
    assert _readable(sock, 5), "a refused connection gets an error frame"
    header = _read_frame(sock)
    assert header.correlation_id == -1
    error = header.error()
    assert isinstance(error, errors.ThrottlingQuotaExceededError) and cap in error.message
    assert sock.recv(1) == b""  # and is closed


def _assert_responsive(node, source: str, topic: str) -> None:
    """A fetch from ``source`` and an admin call, each answering within RESPONSIVE_S."""
    started = time.monotonic()
    with _connect(node.fetch_port, source) as sock:
        sock.sendall(protocol.encode_request(protocol.FetchRequest(7, topic, 0, 0, 1 << 20)))
        header = _read_frame(sock)
    assert header.error() is None and header.correlation_id == 7 and header.records_length > 0
    assert node.describe(topic).log_end_offset >= 1
    assert time.monotonic() - started < RESPONSIVE_S


def test_idle_connections_from_one_address_stop_at_the_per_address_cap(tmp_path):
    node = start_node(tmp_path)
    try:
        node.create("shared")
        node.append("shared", 0, make_batch([b"ok"]))
        cap = DEFAULT_MAX_CONNECTIONS_PER_IP
        idle = [_connect(node.fetch_port) for _ in range(cap + 50)]
        wait_until(lambda: _traffic(node).fetch_connections_refused == 50, timeout=10.0, interval=0.02)
        assert _traffic(node).fetch_connections == cap
        # Accepted in order: the first `cap` stay open and silent, the rest were refused.
        assert not any(_readable(sock) for sock in idle[:cap])
        for sock in idle[cap:]:
            _assert_refused(sock, "fetch.max.connections.per.ip=1024")
        _assert_responsive(node, "127.0.0.2", "shared")  # other clients are served
        node.create("created-meanwhile")  # and the log can still open files
        assert not node.append("created-meanwhile", 0, make_batch([b"x"])).HasField("error")
        for sock in idle:
            sock.close()
        wait_until(lambda: _traffic(node).fetch_connections == 0, timeout=10.0, interval=0.02)
        with _connect(node.fetch_port) as again:  # the address may connect again
            again.sendall(protocol.encode_request(protocol.FetchRequest(1, "shared", 0, 0, 1000)))
            assert _read_frame(again).error() is None
    finally:
        node.close()
        node.process.stop()


def test_a_full_fetch_port_leaves_descriptors_for_partitions_and_segment_rolls(tmp_path):
    """The reproduction at a scale a test can hold: a node whose descriptor limit is 2048, no
    per-address cap, and more idle connections than its share; then partitions and rolls."""
    limit = 2048
    budget = DescriptorBudget.plan(limit, max_open_segments=resolve_max_open_segments(0, limit))
    node = start_node_wrapped(
        tmp_path,
        "small-limit",
        ["prlimit", f"--nofile={limit}:{limit}"],
        "--log-dirs",
        str(tmp_path / "data"),
        "--fetch-max-connections-per-ip",
        "0",
    )
    try:
        node.create("shared")
        node.append("shared", 0, make_batch([b"ok"]))
        # More connections than the node has descriptors: before the cap, this left none.
        idle = [_connect(node.fetch_port, f"127.0.0.{2 + i % 4}") for i in range(limit + 100)]
        refused = limit + 100 - budget.fetch_connections
        wait_until(lambda: _traffic(node).fetch_connections_refused == refused, timeout=10.0, interval=0.02)
        assert _traffic(node).fetch_connections == budget.fetch_connections
        _assert_refused(idle[-1], f"fetch.max.connections={budget.fetch_connections}")
        # The reserve holds: new partitions, appends and segment rolls all open their files.
        for p in range(40):
            node.create("busy", p, **{"segment.bytes": "200"})
            for i in range(3):
                result = node.append("busy", p, make_batch([b"v%d" % i]))
                assert not result.HasField("error"), result.error
        assert node.describe("busy", 39).segment_count == 2  # two ~70-byte batches per segment
        other = grpc.insecure_channel(f"127.0.0.1:{node.process.info['grpc_port']}")
        started = time.monotonic()
        grpc.channel_ready_future(other).result(timeout=5)  # a new gRPC connection is accepted
        assert time.monotonic() - started < RESPONSIVE_S
        other.close()
        for sock in idle:
            sock.close()
        wait_until(lambda: _traffic(node).fetch_connections == 0, timeout=10.0, interval=0.02)
        _assert_responsive(node, "127.0.0.9", "shared")
    finally:
        node.close()
        node.process.stop()


def test_a_connection_cap_the_descriptor_limit_cannot_hold_stops_the_node_at_start(tmp_path):
    with pytest.raises(Exception, match=r"fetch.max.connections=100000 does not fit the descriptor limit"):
        start_node_wrapped(
            tmp_path,
            "too-many",
            ["prlimit", "--nofile=4096:4096"],
            "--log-dirs",
            str(tmp_path / "data"),
            "--fetch-max-connections",
            "100000",
        )


def test_max_wait_is_capped(tmp_path):
    node = start_node(tmp_path, "capped", "--fetch-max-wait-ms", "700")
    try:
        node.create("quiet")
        node.append("quiet", 0, make_batch([b"old"]))
        started = time.monotonic()
        result = node.fetch("quiet", 0, 1, min_bytes=1, max_wait_ms=2**31 - 1)  # nothing new to come
        elapsed = time.monotonic() - started
        assert result.header.error() is None and result.records == b""
        assert 0.6 <= elapsed < 3.0
        assert _traffic(node).fetch_waits_capped == 1
        # A wait under the cap is honoured as asked.
        started = time.monotonic()
        node.fetch("quiet", 0, 1, min_bytes=1, max_wait_ms=200)
        assert 0.15 <= time.monotonic() - started < 0.6
        assert _traffic(node).fetch_waits_capped == 1
    finally:
        node.close()
        node.process.stop()


def test_a_long_poll_ends_when_its_client_disconnects(tmp_path):
    node = start_node(tmp_path)
    try:
        node.create("quiet")
        node.append("quiet", 0, make_batch([b"old"]))
        pollers = []
        for i in range(20):
            sock = _connect(node.fetch_port)
            request = protocol.FetchRequest(i, "quiet", 0, 1, 1 << 20, min_bytes=1, max_wait_ms=25_000)
            sock.sendall(protocol.encode_request(request))
            pollers.append(sock)
        wait_until(lambda: _traffic(node).fetch_requests == 20, timeout=10.0, interval=0.02)
        _assert_responsive(node, "127.0.0.2", "quiet")  # served beside the waiting polls
        started = time.monotonic()
        for sock in pollers:
            sock.close()
        wait_until(lambda: _traffic(node).fetch_polls_cancelled == 20, timeout=5, interval=0.02)
        wait_until(lambda: _traffic(node).fetch_connections == 0, timeout=5, interval=0.02)
        assert time.monotonic() - started < 2.0  # not after the 25 s wait
        # A poll whose client stays is still woken by an append.
        with _connect(node.fetch_port) as stays:
            stays.sendall(
                protocol.encode_request(protocol.FetchRequest(99, "quiet", 0, 1, 1 << 20, max_wait_ms=25_000))
            )
            wait_until(lambda: _traffic(node).fetch_requests == 22, timeout=10.0, interval=0.02)
            node.append("quiet", 0, make_batch([b"new"]))
            header = _read_frame(stays)
            assert header.correlation_id == 99 and header.records_length > 0
    finally:
        node.close()
        node.process.stop()
