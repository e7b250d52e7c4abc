from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import errors
from services.fetchport import multi

partition_fetches = st.builds(
    multi.PartitionFetch,
    topic=st.text(min_size=1, max_size=40),
    partition=st.integers(0, 2**31 - 1),
    fetch_offset=st.integers(-(2**63), 2**63 - 1),
    partition_max_bytes=st.integers(0, 2**31 - 1),
    current_leader_epoch=st.integers(-1, 2**31 - 1),
    last_fetched_epoch=st.integers(-1, 2**31 - 1),
    known_high_watermark=st.just(-1),  # version 1 carries none
    known_log_start_offset=st.just(-1),
)


def _body(frame: bytes) -> bytes:
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


@given(
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    replica_id=st.integers(-1, 2**31 - 1),
    partitions=st.lists(partition_fetches, max_size=8, unique_by=lambda p: (p.topic, p.partition)),
    max_bytes=st.integers(0, 2**31 - 1),
    min_bytes=st.integers(0, 2**31 - 1),
    max_wait_ms=st.integers(0, 2**31 - 1),
)
@settings(max_examples=200, deadline=None)
def test_request_round_trip(correlation_id, replica_id, partitions, max_bytes, min_bytes, max_wait_ms):
    request = multi.MultiFetchRequest(
        correlation_id, replica_id, tuple(partitions), max_bytes, min_bytes, max_wait_ms
    )
    assert multi.decode_request_body(_body(multi.encode_request(request))) == request


@given(
    partitions=st.lists(
        st.builds(
            multi.PartitionFetch,
            topic=st.text(min_size=1, max_size=20),
            partition=st.integers(0, 2**31 - 1),
            fetch_offset=st.integers(-(2**63), 2**63 - 1),
            partition_max_bytes=st.integers(0, 2**31 - 1),
            current_leader_epoch=st.integers(-1, 2**31 - 1),
            last_fetched_epoch=st.integers(-1, 2**31 - 1),
            known_high_watermark=st.integers(-(2**63), 2**63 - 1),
            known_log_start_offset=st.integers(-(2**63), 2**63 - 1),
        ),
        max_size=8,
        unique_by=lambda p: (p.topic, p.partition),
    ),
    isolation=st.sampled_from([multi.READ_UNCOMMITTED, multi.READ_COMMITTED]),
)
@settings(max_examples=100, deadline=None)
def test_sparse_request_round_trip(partitions, isolation):
    request = multi.MultiFetchRequest(
        5, multi.CONSUMER_REPLICA_ID, tuple(partitions), 1000, 1, 0, isolation, sparse=True
    )
    frame = multi.encode_request(request)
    assert struct.unpack_from(">h", frame, 4)[0] == multi.SPARSE_FETCH_VERSION
    assert multi.decode_request_body(_body(frame)) == request
    # 16 bytes more per partition than version 1
    plain = multi.encode_request(multi.MultiFetchRequest(5, -1, tuple(partitions), 1000, 1, 0, isolation))
    assert len(frame) == len(plain) + 16 * len(partitions)


def test_sparse_requests_are_for_consumers_only():
    request = multi.MultiFetchRequest(1, 3, (multi.PartitionFetch("t", 0, 0, 10),), 100, sparse=True)
    with pytest.raises(errors.InvalidRequestError, match="consumers only"):
        multi.decode_request_body(_body(multi.encode_request(request)))


@pytest.mark.parametrize(
    "header,length,committed,quiet",
    [
        (multi.PartitionHeader("t", 0, high_watermark=10, log_start_offset=2), 0, False, True),
        (multi.PartitionHeader("t", 0, high_watermark=11, log_start_offset=2), 0, False, False),
        (multi.PartitionHeader("t", 0, high_watermark=10, log_start_offset=3), 0, False, False),
        (multi.PartitionHeader("t", 0, high_watermark=10, log_start_offset=2), 5, False, False),
        (multi.PartitionHeader("t", 0, error_code=6, high_watermark=10, log_start_offset=2), 0, False, False),
        # read_committed: the last stable offset is what the fetcher knows
        (
            multi.PartitionHeader("t", 0, high_watermark=12, log_start_offset=2, last_stable_offset=10),
            0,
            True,
            True,
        ),
        (
            multi.PartitionHeader("t", 0, high_watermark=10, log_start_offset=2, last_stable_offset=8),
            0,
            True,
            False,
        ),
    ],
)
def test_a_partition_is_quiet_only_when_nothing_is_new(header, length, committed, quiet):
    fetch = multi.PartitionFetch("t", 0, 10, 100, known_high_watermark=10, known_log_start_offset=2)
    assert multi.is_quiet(fetch, header, length, committed) is quiet
    unknown = multi.PartitionFetch("t", 0, 10, 100)
    assert not multi.is_quiet(unknown, header, length, committed)


def test_request_golden_bytes():
    request = multi.MultiFetchRequest(9, 2, (multi.PartitionFetch("ab", 3, 42, 1000, 5, 4),), 4096, 1, 500)
    body = struct.pack(">hiiiiibi", 1, 9, 2, 500, 1, 4096, 0, 1) + struct.pack(">h", 2) + b"ab"
    body += struct.pack(">iiqii", 3, 5, 42, 4, 1000)
    assert multi.encode_request(request) == struct.pack(">i", len(body)) + body


def test_every_truncation_of_a_request_is_refused_cleanly():
    request = multi.MultiFetchRequest(
        1, 3, (multi.PartitionFetch("t", 0, 5, 100), multi.PartitionFetch("u", 1, 6, 100)), 1000
    )
    body = _body(multi.encode_request(request))
    for cut in range(len(body)):
        with pytest.raises(errors.InvalidRequestError):
            multi.decode_request_body(body[:cut])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:2] + struct.pack(">i", 1) + b[6:], None),  # a different correlation id is fine
        (lambda b: b + b"x", "trailing"),
        (lambda b: b[:23] + struct.pack(">i", 10_000) + b[27:], "cannot hold"),
        (lambda b: b[:22] + b"\x07" + b[23:], "isolation level 7"),
        (lambda b: b[:6] + struct.pack(">i", -5) + b[10:], "negative"),
    ],
)
def test_malformed_requests(mutate, reason):
    request = multi.MultiFetchRequest(1, 3, (multi.PartitionFetch("t", 0, 5, 100),), 1000)
    body = mutate(_body(multi.encode_request(request)))
    if reason is None:
        assert multi.decode_request_body(body).partitions == request.partitions
    else:
        with pytest.raises(errors.InvalidRequestError, match=reason):
            multi.decode_request_body(body)


def test_a_partition_named_twice_is_refused():
    request = multi.MultiFetchRequest(1, 3, (multi.PartitionFetch("t", 0, 5, 1),) * 2, 1000)
    with pytest.raises(errors.InvalidRequestError, match="twice"):
        multi.decode_request_body(_body(multi.encode_request(request)))


def test_a_wrong_version_is_unsupported():
    body = bytearray(_body(multi.encode_request(multi.MultiFetchRequest(1, 3, (), 1000))))
    body[0:2] = struct.pack(">h", 7)
    with pytest.raises(errors.UnsupportedVersionError):
        multi.decode_request_body(bytes(body))


def _response(partitions: list[tuple[multi.PartitionHeader, bytes]], error=None) -> bytes:
    body = b"".join(multi.encode_partition_header(h) + records for h, records in partitions)
    return multi.encode_response_prefix(77, len(partitions), len(body), error) + body


def test_response_round_trip_with_records_errors_and_divergence():
    parts = [
        (
            multi.PartitionHeader(
                "a", 0, high_watermark=10, log_start_offset=0, log_end_offset=12, records_length=3
            ),
            b"xyz",
        ),
        (multi.PartitionHeader("b", 4, error_code=6, message="not the leader"), b""),
        (
            multi.PartitionHeader("d", 2, last_stable_offset=8, aborted=((7, 3), (9, 5)), records_length=2),
            b"rc",
        ),
        (multi.PartitionHeader("c", 1, diverging_epoch=3, diverging_end_offset=40, log_end_offset=50), b""),
    ]
    response = multi.decode_response_body(_body(_response(parts)))
    assert response.correlation_id == 77 and response.error() is None
    assert [(p.header, bytes(p.records)) for p in response.partitions] == parts
    assert isinstance(response.partitions[1].header.error(), errors.NotLeaderOrFollowerError)


def test_a_request_level_error_response():
    frame = multi.encode_error_response(5, errors.InvalidRequestError("bad frame"))
    response = multi.decode_response_body(_body(frame))
    assert response.partitions == ()
    assert isinstance(response.error(), errors.InvalidRequestError)
    assert response.message == "bad frame"


def test_every_truncation_of_a_response_is_corrupt():
    body = _body(_response([(multi.PartitionHeader("a", 0, records_length=4), b"abcd")]))
    for cut in range(len(body)):
        with pytest.raises(errors.CorruptRecordError):
            multi.decode_response_body(body[:cut])
    with pytest.raises(errors.CorruptRecordError, match="trailing"):
        multi.decode_response_body(body + b"!")


@given(
    topics=st.lists(st.sampled_from(["a", "b", "ab", "ba", "é", ""]), min_size=1, max_size=40),
    sparse=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_runs_of_one_topic_decode_like_any_other_entries(topics, sparse):
    """The decoder reads a run of entries of one topic with one unpack each: runs of equal-length
    names (``ab`` then ``ba``), names met again after another, and the empty name all decode to
    what was encoded."""
    numbers: dict[str, int] = {}
    partitions = []
    for topic in topics:
        numbers[topic] = numbers.get(topic, -1) + 1
        known = (7, 3) if sparse else (-1, -1)
        partitions.append(
            multi.PartitionFetch(topic, numbers[topic], 100 + len(partitions), 1000, -1, -1, *known)
        )
    request = multi.MultiFetchRequest(
        1, multi.CONSUMER_REPLICA_ID, tuple(partitions), 4096, 1, 0, sparse=sparse
    )
    assert multi.decode_request_body(_body(multi.encode_request(request))) == request


@pytest.mark.parametrize("names", [["t", "t"], ["t", "u", "t"]])
def test_a_partition_named_twice_in_a_run_or_across_runs_is_refused(names):
    request = multi.MultiFetchRequest(
        1, -1, tuple(multi.PartitionFetch(name, 4, 5, 1) for name in names), 1000, sparse=True
    )
    with pytest.raises(errors.InvalidRequestError, match="t-4 twice"):
        multi.decode_request_body(_body(multi.encode_request(request)))


@pytest.mark.parametrize("sparse", [False, True])
def test_a_run_longer_than_the_announced_count_leaves_trailing_bytes(sparse):
    """A run is read in one go up to the partition count the frame announces, never past it."""
    request = multi.MultiFetchRequest(
        1, -1, tuple(multi.PartitionFetch("t", n, 5, 1) for n in range(3)), 1000, sparse=sparse
    )
    body = bytearray(_body(multi.encode_request(request)))
    struct.pack_into(">i", body, 23, 2)  # partition_count: 2 of the 3 entries
    with pytest.raises(errors.InvalidRequestError, match="trailing"):
        multi.decode_request_body(bytes(body))
