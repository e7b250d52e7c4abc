"""The gateway's raw data listener against bad input, with real processes and plain sockets.

Each test speaks the frame format (``services/dataport/protocol.py``) by hand, as a broken or
hostile client would, and checks three things: the answer (an error frame with Kafka's code, a
refused handshake, or a closed connection), that other clients keep producing and consuming
meanwhile, and that no stored byte changed (the reference topic reads back exactly as written).
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from services.dataport import protocol as dp
from services.records import RecordBatchBuilder, iter_batches
from tests.support.names import unique
from tests.support.wait import wait_until

STALL_TIMEOUT_MS = 1500
MAX_CONNECTIONS = 1100
SESSIONS_PER_CONNECTION = 2
PARTITIONS_PER_SESSION = 4
REFERENCE = [b"reference-%03d" % i for i in range(50)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        gateway_args=[
            "--data-stall-timeout-ms",
            str(STALL_TIMEOUT_MS),
            "--data-max-connections",
            str(MAX_CONNECTIONS),
            "--data-fetch-sessions-per-connection",
            str(SESSIONS_PER_CONNECTION),
            "--data-fetch-session-max-partitions",
            str(PARTITIONS_PER_SESSION),
        ],
    )
    with LocalCluster(tmp_path_factory.mktemp("data-listener-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def data_address(cluster) -> tuple[str, int]:
    port = cluster.gateways[0].info["data_port"]
    assert port > 0, "the launcher starts gateways with the data listener on"
    return ("127.0.0.1", port)


@pytest.fixture(scope="module")
def reference_topic(cluster) -> str:
    """A topic with known records; every test ends by reading it back unchanged."""
    topic = unique("reference")
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    with Producer(servers=cluster.gateway, acks="all") as producer:
        for value in REFERENCE:
            producer.send(topic, value)
    return topic


@pytest.fixture(autouse=True)
def _stored_data_unchanged(cluster, reference_topic):
    yield
    assert _read_all(cluster.gateway, reference_topic, len(REFERENCE), data_path="grpc") == REFERENCE


def _read_all(servers: str, topic: str, expected: int, **settings) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(servers=servers, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
        for records in consumer.poll(timeout_ms=200).values():  # nothing more than expected
            values.extend(r.value for r in records)
    return values


def _connect(address, *, handshake: bool = True, version: int = dp.MAX_VERSION) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    if handshake:
        sock.sendall(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, version, "test")))
        answer = dp.decode_handshake_answer(_read_frame(sock))
        assert answer.error_code == 0 and answer.version == version
    return sock


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    return _read_exactly(sock, size)


def _closed_by_gateway(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once the gateway closed the connection (EOF or reset), reading what came before."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _error_frame(sock: socket.socket) -> dp.ErrorFrame:
    body = _read_frame(sock)
    assert dp.decode_header(body)[0] == dp.ERROR
    return dp.decode_error(body)


def _batch(*values: bytes) -> bytes:
    builder = RecordBatchBuilder()
    for value in values:
        builder.append(value, timestamp=1_700_000_000_000)
    return builder.build()


def _produce(sock: socket.socket, correlation_id: int, topic: str, data: bytes, acks: int = 1) -> None:
    sock.sendall(
        dp.encode_produce_request(dp.ProduceRequest(correlation_id, acks, 10_000, topic, [(0, data)]))
    )


def _others_keep_going(cluster, topic: str, tag: bytes) -> None:
    """An SDK producer and consumer (raw path) still work."""
    values = [tag + b"-%d" % i for i in range(100)]
    with Producer(servers=cluster.gateway, acks=1, linger_ms=1) as producer:
        futures = [producer.send(topic, v) for v in values]
        producer.flush(timeout=30)
        sender = producer._core.sender
        assert sender is not None and sender.transport.using_raw
    assert all(f.succeeded() for f in futures)
    assert [v for v in _read_all(cluster.gateway, topic, len(values)) if v.startswith(tag)] == values


@pytest.fixture
def topic(cluster) -> str:
    name = unique("victim")
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(name, 1)])
    return name


# ---- pipelining ---------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_by_correlation_id_in_append_order(data_address, topic):
    with _connect(data_address) as sock:
        for correlation_id in (7, 8, 9):
            _produce(sock, correlation_id, topic, _batch(b"a%d" % correlation_id, b"b%d" % correlation_id))
        _produce(sock, 10, topic, _batch(b"unanswered"), acks=0)
        sock.sendall(
            dp.encode_fetch_request(
                dp.FetchRequest(11, [dp.FetchPartition(topic, 0, 0)], min_bytes=1, max_wait_ms=5000)
            )
        )
        answers = {}
        while len(answers) < 4:
            body = _read_frame(sock)
            kind, correlation_id = dp.decode_header(body)
            answers[correlation_id] = (
                dp.decode_produce_response(body)
                if kind == dp.PRODUCE_RESPONSE
                else dp.decode_fetch_response(body)
            )
    assert set(answers) == {7, 8, 9, 11}, "acks=0 is never answered"
    assert [answers[c].partitions[0].base_offset for c in (7, 8, 9)] == [0, 2, 4]
    fetched = answers[11].partitions[0]
    assert fetched.error_code == 0 and len(fetched.records) > 0
    values = [r.value for batch in iter_batches(bytes(fetched.records)) for r in batch.records()]
    assert values[:2] == [b"a7", b"b7"]


def test_requests_read_together_keep_their_order_per_partition(cluster, data_address):
    # Frames that arrive together are planned and queued one after another in the pass that
    # reads them (merged per partition), acks 0 and 1 mixed, several partitions per request:
    # each partition's records land in arrival order, each acks=1 request learns its offsets,
    # a partition beyond the topic's count fails alone.
    name = unique("together")
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(name, 2)])
    frames = []
    for i in range(60):
        partitions = [(0, _batch(b"p0-%d" % i)), (1, _batch(b"p1-%d-a" % i, b"p1-%d-b" % i))]
        if i % 10 == 3:
            partitions.append((5, _batch(b"nowhere")))
        acks = 0 if i % 3 == 0 else 1
        frames.append(dp.encode_produce_request(dp.ProduceRequest(100 + i, acks, 10_000, name, partitions)))
    with _connect(data_address) as sock:
        sock.sendall(b"".join(frames))
        answers = {}
        while len(answers) < 40:
            response = dp.decode_produce_response(_read_frame(sock))
            answers[response.correlation_id] = response
    assert sorted(answers) == [100 + i for i in range(60) if i % 3]
    for correlation_id, response in answers.items():
        i = correlation_id - 100
        by_partition = {p.partition: p for p in response.partitions}
        assert by_partition[0].error_code == 0 and by_partition[0].base_offset == i
        assert by_partition[1].error_code == 0 and by_partition[1].base_offset == 2 * i
        if i % 10 == 3:
            assert by_partition[5].error_code == errors.UnknownTopicOrPartitionError.kafka_code
        assert sorted(by_partition) == ([0, 1, 5] if i % 10 == 3 else [0, 1])
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(name, 0), TopicPartition(name, 1)])
        values: dict[int, list[bytes]] = {0: [], 1: []}
        deadline = time.monotonic() + 30
        while len(values[0]) + len(values[1]) < 180 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                values[tp.partition].extend(r.value for r in records)
    assert values[0] == [b"p0-%d" % i for i in range(60)]
    assert values[1] == [v for i in range(60) for v in (b"p1-%d-a" % i, b"p1-%d-b" % i)]


def test_frames_served_as_they_arrive_and_by_the_reading_loop_keep_arrival_order(
    cluster, data_address, topic
):
    # The listener's protocol serves produce frames at once while the reading loop waits with
    # nothing buffered, and leaves the rest to the loop: a fetch, a frame not whole, a bad frame.
    # Whoever serves a frame, the partition's records land in arrival order and bad input is
    # refused after the requests before it were answered.
    produce = [
        dp.encode_produce_request(dp.ProduceRequest(20 + i, 1, 10_000, topic, [(0, _batch(b"mixed-%d" % i))]))
        for i in range(6)
    ]
    fetch = dp.encode_fetch_request(dp.FetchRequest(30, [dp.FetchPartition(topic, 0, 0)], max_wait_ms=0))
    with _connect(data_address) as sock:
        sock.sendall(produce[0])  # alone: served by the protocol
        assert dp.decode_produce_response(_read_frame(sock)).partitions[0].base_offset == 0
        sock.sendall(produce[1] + fetch + produce[2] + produce[3][:7])  # a fetch, then half a frame
        time.sleep(0.2)  # (not synchronisation: the second half arrives in a read of its own)
        sock.sendall(produce[3][7:] + produce[4])
        answers = {}
        while len(answers) < 5:
            body = _read_frame(sock)
            kind, correlation_id = dp.decode_header(body)
            answers[correlation_id] = (
                dp.decode_produce_response(body)
                if kind == dp.PRODUCE_RESPONSE
                else dp.decode_fetch_response(body)
            )
        assert [answers[20 + i].partitions[0].base_offset for i in range(1, 5)] == [1, 2, 3, 4]
        assert answers[30].error_code == 0
        # A frame below the minimum size ends the connection (the answer owed to the request
        # before it is lost with it; its append still runs, as after any closed connection).
        sock.sendall(produce[5] + struct.pack(">i", 3) + b"bad")
        body = _read_frame(sock)
        if dp.decode_header(body)[0] == dp.PRODUCE_RESPONSE:
            assert dp.decode_produce_response(body).partitions[0].base_offset == 5
            body = _read_frame(sock)
        assert dp.decode_header(body)[0] == dp.ERROR
        assert dp.decode_error(body).error_code == errors.InvalidRequestError.kafka_code
        assert _closed_by_gateway(sock)
    assert _read_all(cluster.gateway, topic, 6) == [b"mixed-%d" % i for i in range(6)]


def test_frames_cut_across_reads_anywhere_keep_arrival_order(cluster, data_address, topic):
    # The reading loop serves the frames of each read in place and finishes a frame begun in an
    # earlier read from the next one: reads that end inside a size prefix, inside a frame, just
    # after one, around a fetch (which the loop serves itself) all keep each request's place.
    frames = []
    for i in range(40):
        acks = 0 if i % 4 == 0 else 1
        frames.append(
            dp.encode_produce_request(
                dp.ProduceRequest(200 + i, acks, 10_000, topic, [(0, _batch(b"cut-%d" % i, b"x" * (i * 37)))])
            )
        )
        if i == 17:
            frames.append(
                dp.encode_fetch_request(dp.FetchRequest(300, [dp.FetchPartition(topic, 0, 0)], max_wait_ms=0))
            )
    stream = b"".join(frames)
    cuts = (2, 1, 5, 700, 3, 1500, 9, 64, 2, 4000, 1, 333)  # piece sizes, repeated to the end
    position = 0
    answered = {200 + i for i in range(40) if i % 4} | {300}
    with _connect(data_address) as sock:
        pieces = 0
        while position < len(stream):
            step = cuts[pieces % len(cuts)]
            sock.sendall(stream[position : position + step])
            position += step
            pieces += 1
            time.sleep(0.01)  # (not synchronisation: each piece tends to arrive in a read of its own)
        answers = {}
        while len(answers) < len(answered):
            body = _read_frame(sock)
            kind, correlation_id = dp.decode_header(body)
            answers[correlation_id] = (
                dp.decode_produce_response(body)
                if kind == dp.PRODUCE_RESPONSE
                else dp.decode_fetch_response(body)
            )
    assert set(answers) == answered
    assert [answers[c].partitions[0].base_offset for c in sorted(answered - {300})] == [
        2 * (c - 200) for c in sorted(answered - {300})
    ]
    assert answers[300].error_code == 0
    expected = [v for i in range(40) for v in (b"cut-%d" % i, b"x" * (i * 37))]
    assert _read_all(cluster.gateway, topic, len(expected)) == expected


# ---- bad input ----------------------------------------------------------------------------------


def test_garbage_instead_of_a_handshake_gets_an_error_frame_and_a_close(cluster, data_address, topic):
    with _connect(data_address, handshake=False) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: gateway\r\n\r\n")
        error = _error_frame(sock)
        assert error.correlation_id == dp.NO_CORRELATION_ID
        assert isinstance(error.error(), errors.InvalidRequestError)
        assert _closed_by_gateway(sock)
    _others_keep_going(cluster, topic, b"after-garbage")


def test_garbage_after_the_handshake_gets_an_error_frame_and_a_close(data_address, topic):
    with _connect(data_address) as sock:
        sock.sendall(struct.pack(">i", 12) + b"\x55" * 12)  # kind 0x55: no such frame
        error = _error_frame(sock)
        assert isinstance(error.error(), errors.InvalidRequestError)
        assert _closed_by_gateway(sock)


def test_a_huge_length_prefix_is_refused_without_reading_it(data_address):
    with _connect(data_address) as sock:
        sock.sendall(struct.pack(">i", 2**31 - 1) + b"\x01")
        error = _error_frame(sock)
        assert isinstance(error.error(), errors.InvalidRequestError)
        assert "size" in error.message
        assert _closed_by_gateway(sock)


def test_a_malformed_produce_frame_is_refused_and_stores_nothing(cluster, data_address, topic):
    name = topic.encode()
    # one partition whose records' length says more than the frame holds
    body = (
        struct.pack(">bibih", dp.PRODUCE_REQUEST, 42, 1, 1000, len(name))
        + name
        + struct.pack(">iii", 1, 0, 1 << 20)
        + _batch(b"never stored")
    )
    broken = struct.pack(">i", len(body)) + body
    with _connect(data_address) as sock:
        sock.sendall(broken)
        error = _error_frame(sock)
        assert error.correlation_id == 42
        assert isinstance(error.error(), errors.InvalidRequestError)
        assert _closed_by_gateway(sock)
    assert _read_all(cluster.gateway, topic, 0) == []


def test_a_corrupt_batch_in_a_wellformed_frame_fails_its_partition_only(cluster, data_address, topic):
    good = _batch(b"good")
    corrupt = bytearray(_batch(b"corrupt"))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    with _connect(data_address) as sock:
        _produce(sock, 1, topic, bytes(corrupt))
        _produce(sock, 2, topic, good)
        answers = {}
        for _ in range(2):
            answer = dp.decode_produce_response(_read_frame(sock))
            answers[answer.correlation_id] = answer.partitions[0]
    assert isinstance(answers[1].error(), errors.CorruptRecordError)
    assert answers[2].error_code == 0 and answers[2].base_offset == 0
    assert _read_all(cluster.gateway, topic, 1) == [b"good"]


def test_a_truncated_frame_then_a_close_is_dropped(cluster, data_address, topic):
    with _connect(data_address) as sock:
        frame = dp.encode_produce_request(dp.ProduceRequest(5, 1, 1000, topic, [(0, _batch(b"half"))]))
        sock.sendall(frame[: len(frame) // 2])
        sock.shutdown(socket.SHUT_WR)
        assert _closed_by_gateway(sock)
    _others_keep_going(cluster, topic, b"after-truncation")
    assert b"half" not in _read_all(cluster.gateway, topic, 100)


def test_an_unknown_version_is_refused_in_the_handshake(data_address):
    with _connect(data_address, handshake=False) as sock:
        sock.sendall(dp.encode_handshake(dp.Handshake(90, 99, "from-the-future")))
        answer = dp.decode_handshake_answer(_read_frame(sock))
        assert isinstance(answer.error(), errors.UnsupportedVersionError)
        assert answer.version == -1
        assert (answer.min_version, answer.max_version) == (dp.MIN_VERSION, dp.MAX_VERSION)
        assert _closed_by_gateway(sock)


def test_a_client_stalled_mid_frame_is_disconnected(data_address, topic):
    with _connect(data_address) as sock:
        frame = dp.encode_produce_request(dp.ProduceRequest(5, 1, 1000, topic, [(0, _batch(b"stalled"))]))
        sock.sendall(frame[:9])
        started = time.monotonic()
        assert _closed_by_gateway(sock, timeout=STALL_TIMEOUT_MS / 1000 + 10)
        assert time.monotonic() - started >= STALL_TIMEOUT_MS / 1000 * 0.9


def test_a_client_that_never_reads_its_answers_is_disconnected(cluster, data_address, topic):
    """Pipelined fetches whose answers (~1 MiB each) are never read: the gateway stops reading
    once they pile up, and closes the connection after the stall timeout, instead of holding
    them in memory."""
    with Producer(servers=cluster.gateway, acks=1, linger_ms=5) as producer:
        for _ in range(1200):
            producer.send(topic, b"y" * 1000)
        producer.flush(timeout=30)
    log_file = cluster.gateways[0].log_file
    with _connect(data_address) as sock:
        host, port = sock.getsockname()[:2]
        peer = f"{host}:{port}"
        fetch = dp.FetchPartition(topic, 0, 0, 1 << 20)
        for correlation_id in range(40):
            sock.sendall(dp.encode_fetch_request(dp.FetchRequest(correlation_id, [fetch], max_bytes=1 << 20)))
        wait_until(
            lambda: any(
                peer in line and "does not read its answers" in line
                for line in log_file.read_text().splitlines()
            ),
            timeout=30,
            what="the gateway giving up on a client that does not read",
        )
        received = 0
        sock.settimeout(10)
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 40 << 20, "the connection ended before every answer was sent"


def test_a_thousand_half_open_connections_do_not_stop_other_clients(cluster, data_address, topic):
    """500 connections stalled inside the handshake and 500 that handshook and went quiet: the
    SDK still produces and consumes, the stalled ones are closed, the quiet ones stay open."""
    stalled = []
    quiet: list[socket.socket] = []
    try:
        for _ in range(500):
            sock = _connect(data_address, handshake=False)
            stalled.append(sock)
            sock.sendall(dp.encode_handshake(dp.Handshake(1, 1))[:6])
        quiet.extend(_connect(data_address) for _ in range(500))
        _others_keep_going(cluster, topic, b"beside-a-thousand")
        for sock in stalled:
            assert _closed_by_gateway(sock, timeout=STALL_TIMEOUT_MS / 1000 + 10)
        # the quiet ones are still served
        _produce(quiet[-1], 3, topic, _batch(b"from-a-quiet-one"))
        answer = dp.decode_produce_response(_read_frame(quiet[-1]))
        assert answer.partitions[0].error_code == 0
    finally:
        for sock in stalled + quiet:
            sock.close()


def test_connections_beyond_the_cap_are_refused_with_an_error_frame(data_address):
    opened: list[socket.socket] = []
    refusal = None
    try:
        for _ in range(MAX_CONNECTIONS + 10):
            sock = socket.create_connection(data_address, timeout=10)
            opened.append(sock)
            sock.sendall(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, dp.MAX_VERSION)))
            body = _read_frame(sock)
            if dp.decode_header(body)[0] == dp.ERROR and len(body) >= dp.MIN_FRAME + 2:
                refusal = dp.decode_error(body)
                break
            # a handshake answer: the magic number first
            assert dp.decode_handshake_answer(body).error_code == 0
        assert refusal is not None, f"{len(opened)} connections accepted with a cap of {MAX_CONNECTIONS}"
        assert isinstance(refusal.error(), errors.NetworkError)
        assert len(opened) <= MAX_CONNECTIONS + 1
    finally:
        for sock in opened:
            sock.close()
    # once they are gone, new clients are welcome again
    wait_until(
        lambda: _connect(data_address).close() is None,
        timeout=10,
        what="a new connection",
        tolerate=(AssertionError, ConnectionError, errors.TributaryError),
    )


# ---- fetch sessions (version 3) ------------------------------------------------------------------


def _fetch(sock: socket.socket, request: dp.FetchRequest, version: int = dp.MAX_VERSION) -> dp.FetchResponse:
    sock.sendall(dp.encode_fetch_request(request, version))
    body = _read_frame(sock)
    assert dp.decode_header(body)[0] == dp.FETCH_RESPONSE, dp.decode_error(body)
    return dp.decode_fetch_response(body, version)


def _whole(topic: str, *partitions: int, offset: int = 0) -> list[dp.FetchPartition]:
    return [dp.FetchPartition(topic, p, offset, 1 << 20) for p in partitions]


def test_session_errors_are_answered_and_the_connection_goes_on(data_address, reference_topic):
    sock = _connect(data_address)
    try:
        unknown = _fetch(sock, dp.FetchRequest(1, [], session_id=12345, session_epoch=1))
        assert isinstance(unknown.error(), errors.FetchSessionIdNotFoundError)
        assert unknown.partitions == [] and unknown.session_id == 12345
        # a full fetch opens a session and answers every partition
        full = _fetch(sock, dp.FetchRequest(2, _whole(reference_topic, 0), session_epoch=dp.INITIAL_EPOCH))
        assert full.error_code == 0 and full.session_id != 0
        [whole] = full.partitions
        assert (
            whole.next_offset == len(REFERENCE)
            and [r.value for b in iter_batches(bytes(whole.records)) for r in b.records()] == REFERENCE
        )
        session = full.session_id
        wrong = _fetch(sock, dp.FetchRequest(3, [], session_id=session, session_epoch=7))
        assert isinstance(wrong.error(), errors.InvalidFetchSessionEpochError)
        # the right epoch: nothing new, so an empty answer
        quiet = _fetch(sock, dp.FetchRequest(4, [], session_id=session, session_epoch=1))
        assert quiet.error_code == 0 and quiet.partitions == [] and quiet.session_id == session
        # a seek back is answered with the records again
        again = _fetch(
            sock,
            dp.FetchRequest(5, _whole(reference_topic, 0, offset=40), session_id=session, session_epoch=2),
        )
        assert [p.next_offset for p in again.partitions] == [len(REFERENCE)]
        forgotten = _fetch(
            sock,
            dp.FetchRequest(6, [], session_id=session, session_epoch=3, forgotten=((reference_topic, 0),)),
        )
        assert forgotten.error_code == 0 and forgotten.partitions == []
    finally:
        sock.close()


def test_session_bounds_evict_and_refuse_with_clear_errors(data_address, reference_topic):
    sock = _connect(data_address)
    try:
        # over the partition cap: served, without a session
        wide = _fetch(
            sock,
            dp.FetchRequest(
                1, _whole(reference_topic, *range(PARTITIONS_PER_SESSION + 1)), session_epoch=dp.INITIAL_EPOCH
            ),
        )
        assert wide.session_id == 0 and len(wide.partitions) == PARTITIONS_PER_SESSION + 1
        assert isinstance(wide.partitions[1].error(), errors.UnknownTopicOrPartitionError)
        # one session more than the cap evicts the least recently used
        opened = [
            _fetch(sock, dp.FetchRequest(2 + i, _whole(reference_topic, 0), session_epoch=0)).session_id
            for i in range(SESSIONS_PER_CONNECTION + 1)
        ]
        assert len(set(opened)) == len(opened) and 0 not in opened
        evicted = _fetch(sock, dp.FetchRequest(9, [], session_id=opened[0], session_epoch=1))
        assert isinstance(evicted.error(), errors.FetchSessionIdNotFoundError)
        assert _fetch(sock, dp.FetchRequest(10, [], session_id=opened[-1], session_epoch=1)).error_code == 0
        # growing a session past the partition cap closes it, saying why
        grown = _fetch(
            sock,
            dp.FetchRequest(
                11,
                _whole(reference_topic, *range(1, PARTITIONS_PER_SESSION + 1)),
                session_id=opened[-1],
                session_epoch=2,
            ),
        )
        assert isinstance(grown.error(), errors.FetchSessionIdNotFoundError)
        assert f"more than this gateway's {PARTITIONS_PER_SESSION}" in grown.message
    finally:
        sock.close()


@pytest.mark.parametrize(
    "session_fields",
    [
        struct.pack(">ii", -3, 1),  # a negative session id
        struct.pack(">ii", 5, -9),  # an epoch below -1
        struct.pack(">ii", 0, 4),  # incremental without a session
        struct.pack(">ii", 5, 1) + struct.pack(">i", 2**31 - 1),  # a partition list it cannot hold
    ],
)
def test_bad_session_fields_get_an_error_frame_and_a_close(data_address, session_fields):
    sock = _connect(data_address)
    fixed = struct.pack(">biii", 0, 0, 0, 0)
    rest = b"" if len(session_fields) > 8 else struct.pack(">ii", 0, 0) + struct.pack(">h", 0)
    body = struct.pack(">bi", dp.FETCH_REQUEST, 77) + fixed + session_fields + rest
    sock.sendall(struct.pack(">i", len(body)) + body)
    frame = _error_frame(sock)
    assert frame.correlation_id == 77 and isinstance(frame.error(), errors.InvalidRequestError)
    assert _closed_by_gateway(sock)


def test_a_version_2_client_fetches_as_before(data_address, reference_topic):
    sock = _connect(data_address, version=2)
    try:
        answer = _fetch(sock, dp.FetchRequest(1, _whole(reference_topic, 0)), version=2)
        assert answer.error_code == 0 and answer.session_id == 0
        assert [p.next_offset for p in answer.partitions] == [len(REFERENCE)]
    finally:
        sock.close()
