"""The raw data protocol's codec (services/dataport/protocol.py): round trips and malformed input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import errors
from services.dataport import protocol as dp

topics = st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) <= dp.MAX_TOPIC_BYTES)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


def _body(frame: bytes) -> bytes:
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


def test_handshake_round_trip_and_version_choice():
    body = _body(dp.encode_handshake(dp.Handshake(1, 3, "app-1")))
    handshake = dp.decode_handshake(body)
    assert handshake == dp.Handshake(1, 3, "app-1")
    assert dp.choose_version(handshake, 1, 2) == 2
    assert dp.choose_version(dp.Handshake(5, 9), 1, 2) is None
    assert dp.choose_version(dp.Handshake(0, 0), 1, 1) is None


def test_handshake_answer_round_trip():
    answer = dp.HandshakeAnswer(35, -1, 1, 1, 1 << 20, "speaks 1..1")
    decoded = dp.decode_handshake_answer(_body(dp.encode_handshake_answer(answer)))
    assert decoded == answer
    assert isinstance(decoded.error(), errors.UnsupportedVersionError)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"GET / HTTP/1.1\r\n",
        struct.pack(">ihh", 0x12345678, 1, 1) + b"\x00\x00",  # wrong magic
        struct.pack(">ihh", dp.MAGIC, 2, 1) + b"\x00\x00",  # min above max
        struct.pack(">ihh", dp.MAGIC, 1, 1) + b"\x00\x05ab",  # client id truncated
        struct.pack(">ihh", dp.MAGIC, 1, 1) + b"\x00\x02\xff\xfe",  # not UTF-8
        struct.pack(">ihh", dp.MAGIC, 1, 1) + b"\x00\x00extra",  # trailing bytes
    ],
)
def test_malformed_handshakes_are_invalid_requests(body):
    with pytest.raises(errors.InvalidRequestError):
        dp.decode_handshake(body)


@given(
    correlation_id=int32,
    acks=st.sampled_from([0, 1, -1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    topic=topics,
    partitions=st.dictionaries(st.integers(0, 2**31 - 1), st.binary(max_size=64), max_size=5),
    trace_context=st.sampled_from(["", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]),
)
@settings(max_examples=100, deadline=None)
def test_produce_request_round_trip(correlation_id, acks, timeout_ms, topic, partitions, trace_context):
    request = dp.ProduceRequest(
        correlation_id, acks, timeout_ms, topic, list(partitions.items()), trace_context
    )
    body = _body(dp.encode_produce_request(request))
    assert dp.decode_header(body) == (dp.PRODUCE_REQUEST, correlation_id)
    decoded = dp.decode_produce_request(body)
    assert decoded._replace(partitions=[]) == request._replace(partitions=[])
    assert [(p, bytes(d)) for p, d in decoded.partitions] == list(partitions.items())


@given(
    correlation_id=int32,
    code=st.integers(-1, 120),
    results=st.lists(
        st.builds(
            dp.PartitionProduceResult,
            st.integers(0, 2**31 - 1),
            st.integers(-1, 120),
            int64,
            int64,
            int64,
            int32,
            st.text(max_size=20),
        ),
        max_size=5,
    ),
)
@settings(max_examples=100, deadline=None)
def test_produce_response_round_trip(correlation_id, code, results):
    response = dp.ProduceResponse(correlation_id, code, "why" if code else "", results)
    assert dp.decode_produce_response(_body(dp.encode_produce_response(response))) == response


fetch_partitions = st.builds(
    dp.FetchPartition, topics, st.integers(0, 2**31 - 1), int64, st.integers(0, 2**31 - 1)
)


@given(
    correlation_id=int32,
    partitions=st.lists(fetch_partitions, max_size=6, unique_by=lambda p: (p.topic, p.partition)),
    sizes=st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)),
    isolation=st.sampled_from([0, 1]),
    trace_context=st.text(max_size=60),
)
@settings(max_examples=100, deadline=None)
def test_fetch_request_round_trip(correlation_id, partitions, sizes, isolation, trace_context):
    request = dp.FetchRequest(correlation_id, partitions, *sizes, isolation, trace_context)
    assert dp.decode_fetch_request(_body(dp.encode_fetch_request(request))) == request


@given(
    correlation_id=int32,
    results=st.lists(
        st.builds(
            dp.FetchPartitionResult,
            topics,
            st.integers(0, 2**31 - 1),
            st.integers(-1, 120),
            int64,
            int64,
            int64,
            int64,
            st.lists(st.tuples(int64, int64), max_size=3).map(tuple),
            st.text(max_size=20),
            st.binary(max_size=100),
        ),
        max_size=5,
    ),
)
@settings(max_examples=100, deadline=None)
def test_fetch_response_round_trip_keeps_record_bytes(correlation_id, results):
    response = dp.FetchResponse(correlation_id, 0, "", results)
    parts = dp.encode_fetch_response_parts(response)
    # the records are passed through, not copied into a frame
    for result in results:
        if result.records:
            assert any(part is result.records for part in parts)
    decoded = dp.decode_fetch_response(_body(b"".join(parts)))
    assert [r._replace(records=bytes(r.records)) for r in decoded.partitions] == results
    assert decoded._replace(partitions=[]) == response._replace(partitions=[])


def test_error_frame_round_trip():
    frame = dp.encode_error(7, errors.InvalidRequestError("bad frame"))
    decoded = dp.decode_error(_body(frame))
    assert decoded == dp.ErrorFrame(7, 42, "bad frame")
    assert isinstance(decoded.error(), errors.InvalidRequestError)


def test_long_messages_are_cut_on_a_character_boundary():
    response = dp.ProduceResponse(1, 42, "\u00e9" * 20_000, [])
    decoded = dp.decode_produce_response(_body(dp.encode_produce_response(response)))
    assert decoded.message == "\u00e9" * 16383


@pytest.mark.parametrize("size", [-1, 0, 4, dp.MAX_REQUEST_FRAME + 1, 2**31 - 1])
def test_frame_sizes_outside_the_limits_are_refused(size):
    assert not dp.frame_size_ok(size, dp.MAX_REQUEST_FRAME)
    with pytest.raises(errors.InvalidRequestError):
        dp.check_frame_size(size, dp.MAX_REQUEST_FRAME)


@pytest.mark.parametrize("size", [dp.MIN_FRAME, 1000, dp.MAX_REQUEST_FRAME])
def test_frame_sizes_within_the_limits_are_taken(size):
    # the predicate the listener's callback path uses, and the check its reading loop makes
    assert dp.frame_size_ok(size, dp.MAX_REQUEST_FRAME)
    dp.check_frame_size(size, dp.MAX_REQUEST_FRAME)


def _produce_body(**changes) -> bytes:
    request = dp.ProduceRequest(3, 1, 1000, "t", [(0, b"abc"), (1, b"de")])._replace(**changes)
    return _body(dp.encode_produce_request(request))


@pytest.mark.parametrize(
    "body",
    [
        _produce_body()[:-1],  # truncated records
        _produce_body() + b"x",  # trailing byte
        _produce_body(acks=2),
        _produce_body(timeout_ms=-5),
        _produce_body(partitions=[(0, b"a"), (0, b"b")]),  # repeated partition
        _produce_body(partitions=[(-1, b"a")]),
        _produce_body()[:5] + struct.pack(">bi", 1, 0) + b"\x00\x01t" + struct.pack(">i", 2**31 - 1),
        _produce_body()[:5] + struct.pack(">bi", 1, 0) + b"\x00\x01t" + struct.pack(">iii", 1, 0, -4),
        _produce_body()[:5] + struct.pack(">bi", 1, 0) + b"\x7f\xff",  # topic longer than allowed
        _produce_body()[:5] + struct.pack(">bi", 1, 0) + b"\x00\x02\xc3\x28" + struct.pack(">i", 0),
    ],
)
def test_malformed_produce_requests_are_invalid_requests(body):
    with pytest.raises(errors.InvalidRequestError):
        dp.decode_produce_request(body)


def _fetch_body(**changes) -> bytes:
    request = dp.FetchRequest(4, [dp.FetchPartition("t", 0, 5, 100)], 10, 1, 100, 0)._replace(**changes)
    return _body(dp.encode_fetch_request(request))


@pytest.mark.parametrize(
    "body",
    [
        _fetch_body()[:-1],
        _fetch_body() + b"\x00",
        _fetch_body(isolation_level=3),
        _fetch_body(max_wait_ms=-1),
        _fetch_body(partitions=[dp.FetchPartition("t", 0, 5), dp.FetchPartition("t", 0, 9)]),
        _fetch_body(partitions=[dp.FetchPartition("t", -2, 5)]),
        _fetch_body()[:18] + struct.pack(">i", 10_000_000),  # more partitions than the frame holds
    ],
)
def test_malformed_fetch_requests_are_invalid_requests(body):
    with pytest.raises(errors.InvalidRequestError):
        dp.decode_fetch_request(body)


def test_malformed_responses_are_corrupt():
    good = _body(dp.encode_fetch_response(dp.FetchResponse(1, 0, "", [dp.FetchPartitionResult("t", 0)])))
    with pytest.raises(errors.CorruptRecordError):
        dp.decode_fetch_response(good[:-2])
    with pytest.raises(errors.CorruptRecordError):
        dp.decode_produce_response(_body(dp.encode_produce_response(dp.ProduceResponse(1, 0, "", [])))[:-1])
    with pytest.raises(errors.CorruptRecordError):
        dp.decode_handshake_answer(b"\x00" * 3)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_never_escapes_the_taxonomy(garbage):
    body = struct.pack(">bi", dp.PRODUCE_REQUEST, 1) + garbage
    for decode in (dp.decode_produce_request, dp.decode_fetch_request):
        try:
            decode(body)
        except errors.InvalidRequestError:
            pass
    for decode in (dp.decode_produce_response, dp.decode_fetch_response, dp.decode_error):
        try:
            decode(body)
        except errors.CorruptRecordError:
            pass
    try:
        dp.decode_handshake(garbage)
    except errors.InvalidRequestError:
        pass


def test_the_one_partition_answer_fast_path_agrees_with_the_general_decoder():
    plain = dp.ProduceResponse(9, 0, "", [dp.PartitionProduceResult(3, 0, 100, -1, 0, 7)])
    body = _body(dp.encode_produce_response(plain))
    assert dp.decode_produce_response(body) == plain
    with_error = plain._replace(partitions=[dp.PartitionProduceResult(3, 6, -1, -1, -1, 0, "not leader")])
    assert dp.decode_produce_response(_body(dp.encode_produce_response(with_error))) == with_error
    bad = bytearray(body)
    bad[-1] = 5  # a partition message of 5 bytes the frame does not hold
    with pytest.raises(errors.CorruptRecordError):
        dp.decode_produce_response(bytes(bad))


@pytest.mark.parametrize("version", [1, 2])
def test_throttle_time_travels_in_version_2_only(version):
    """Version 2 answers carry throttle_time_ms (client quotas); version 1 answers are as they
    were, so a gateway can still serve a client that offers only version 1."""
    throttle = 250 if version == 2 else 0
    produce = dp.ProduceResponse(9, 0, "", [dp.PartitionProduceResult(3, 0, 100, -1, 0, 7)], throttle)
    many = produce._replace(
        partitions=[dp.PartitionProduceResult(1), dp.PartitionProduceResult(2, 6, message="x")]
    )
    fetch = dp.FetchResponse(4, 0, "", [dp.FetchPartitionResult("t", 0, records=b"abc")], throttle)
    for response in (produce, many):  # the one-partition fast path and the general decoder
        body = _body(dp.encode_produce_response(response._replace(throttle_time_ms=250), version))
        assert dp.decode_produce_response(body, version) == response
    body = _body(dp.encode_fetch_response(fetch._replace(throttle_time_ms=250), version))
    decoded = dp.decode_fetch_response(body, version)
    assert decoded.throttle_time_ms == throttle
    assert bytes(decoded.partitions[0].records) == b"abc"


def test_version_1_frames_are_4_bytes_shorter():
    response = dp.ProduceResponse(1, 0, "", [dp.PartitionProduceResult(0)], 7)
    assert len(dp.encode_produce_response(response, 1)) + 4 == len(dp.encode_produce_response(response, 2))
    assert dp.THROTTLE_VERSION == 2 and dp.MIN_VERSION == 1


def test_a_negative_throttle_time_is_a_corrupt_answer():
    body = bytearray(_body(dp.encode_fetch_response(dp.FetchResponse(1, 0, "", []), 2)))
    body[5:9] = struct.pack(">i", -1)
    with pytest.raises(errors.CorruptRecordError, match="negative throttle_time_ms"):
        dp.decode_fetch_response(bytes(body), 2)


def _decoded(decode, body):
    try:
        return decode(body)
    except errors.InvalidRequestError as exc:
        return ("refused", str(exc))


def test_the_one_partition_produce_parse_agrees_with_the_general_one():
    """decode_produce_request reads the usual frame (one partition, no trace context) with a
    short cut: on any frame, whole or damaged, it answers what the general parse answers."""
    import random

    from services.dataport.protocol import _decode_produce_request

    rng = random.Random(19)
    frames = []
    for topic, partitions, trace in [
        ("t", [(0, b"x" * 70)], ""),
        ("topic-é", [(7, b"")], ""),
        ("t", [(0, b"a" * 61), (3, b"b" * 61)], ""),
        ("t", [(2, b"c" * 61)], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("", [], ""),
    ]:
        for acks in (0, 1, -1):
            request = dp.ProduceRequest(
                rng.randrange(1 << 31), acks, rng.choice((0, 1500)), topic, partitions, trace
            )
            frames.append(dp.encode_produce_request(request)[4:])
    cases = list(frames)
    for _ in range(3000):
        body = bytearray(rng.choice(frames))
        for _ in range(rng.randrange(1, 3)):
            what = rng.randrange(3)
            if what == 0 and body:
                body[rng.randrange(len(body))] = rng.choice((0, 1, 0x80, 0xFF, rng.randrange(256)))
            elif what == 1:
                del body[rng.randrange(len(body) + 1) :]
            else:
                body += bytes(rng.randrange(1, 4))
        if len(body) >= dp.MIN_FRAME:
            cases.append(bytes(body))
    for body in cases:
        assert _decoded(dp.decode_produce_request, body) == _decoded(_decode_produce_request, body), body
        view = memoryview(body)
        assert _decoded(dp.decode_produce_request, view) == _decoded(_decode_produce_request, view), body
