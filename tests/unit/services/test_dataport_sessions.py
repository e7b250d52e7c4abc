"""Fetch sessions in the data protocol (version 3): frames round trip, version 2 has no session
fields, and bad session fields are INVALID_REQUEST."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import errors
from services.dataport import protocol as dp

topics = st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= dp.MAX_TOPIC_BYTES)
keys = st.tuples(topics, st.integers(0, 2**31 - 1))


def _body(frame: bytes) -> bytes:
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    return frame[4:]


@given(
    session_id=st.integers(1, 2**31 - 1),
    epoch=st.integers(1, 2**31 - 1),
    changed=st.lists(keys, max_size=5, unique=True),
    forgotten=st.lists(keys, max_size=5, unique=True),
)
@settings(max_examples=100, deadline=None)
def test_incremental_fetch_request_round_trip(session_id, epoch, changed, forgotten):
    forgotten = [key for key in forgotten if key not in changed]
    request = dp.FetchRequest(
        7,
        [dp.FetchPartition(t, p, 42, 1000) for t, p in changed],
        max_bytes=100,
        session_id=session_id,
        session_epoch=epoch,
        forgotten=tuple(forgotten),
    )
    assert request.incremental
    assert dp.decode_fetch_request(_body(dp.encode_fetch_request(request)), 3) == request


@pytest.mark.parametrize("session_id,epoch", [(0, -1), (0, 0), (12, 0), (12, -1)])
def test_full_and_sessionless_requests_round_trip(session_id, epoch):
    request = dp.FetchRequest(
        1, [dp.FetchPartition("t", 0, 5, 9)], session_id=session_id, session_epoch=epoch
    )
    assert not request.incremental
    assert dp.decode_fetch_request(_body(dp.encode_fetch_request(request, 3)), 3) == request


def test_version_2_frames_have_no_session_fields():
    request = dp.FetchRequest(1, [dp.FetchPartition("t", 0, 5, 9)], max_bytes=3)
    v2, v3 = dp.encode_fetch_request(request, 2), dp.encode_fetch_request(request, 3)
    assert len(v3) == len(v2) + 8 + 4  # session id and epoch, the forgotten count
    assert dp.decode_fetch_request(_body(v2), 2) == request
    with pytest.raises(ValueError, match="version 3"):
        dp.encode_fetch_request(request._replace(session_epoch=0), 2)
    response = dp.FetchResponse(1, 0, "", [dp.FetchPartitionResult("t", 0)], 5, session_id=77)
    assert len(dp.encode_fetch_response(response, 3)) == len(dp.encode_fetch_response(response, 2)) + 4
    assert dp.decode_fetch_response(_body(dp.encode_fetch_response(response, 3)), 3) == response
    assert dp.decode_fetch_response(_body(dp.encode_fetch_response(response, 2)), 2).session_id == 0


def _session_body(session_id: int, epoch: int, partitions=(), forgotten=()) -> bytes:
    """A v3 fetch request with any session fields (the encoder does not check them)."""
    parts = [struct.pack(">biii", 0, 0, 0, 0), struct.pack(">ii", session_id, epoch)]
    parts.append(struct.pack(">i", len(partitions)))
    for topic, partition in partitions:
        parts.append(struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">iqi", partition, 0, 0))
    parts.append(struct.pack(">i", len(forgotten)))
    for topic, partition in forgotten:
        parts.append(struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", partition))
    parts.append(struct.pack(">h", 0))
    return struct.pack(">bi", dp.FETCH_REQUEST, 3) + b"".join(parts)


@pytest.mark.parametrize(
    "body,reason",
    [
        (_session_body(-5, 1), "negative"),
        (_session_body(5, -2), "negative"),
        (_session_body(0, 3), "without a session id"),
        (_session_body(5, 0, forgotten=[("t", 1)]), "not incremental forgets"),
        (_session_body(5, -1, forgotten=[("t", 1)]), "not incremental forgets"),
        (_session_body(5, 2, [("t", 1)], [("t", 1)]), "both fetched and forgotten"),
        (_session_body(5, 2)[:-3] + struct.pack(">i", 50_000_000) + b"\x00\x00", "cannot hold"),
        (_session_body(5, 2)[:-1], "truncated"),
    ],
)
def test_bad_session_fields_are_invalid_requests(body, reason):
    with pytest.raises(errors.InvalidRequestError, match=reason):
        dp.decode_fetch_request(body, 3)


def test_a_huge_partition_list_announcement_costs_nothing():
    body = _session_body(5, 2)
    offset = 5 + 13 + 8  # header, fixed fields, session: then the partition count
    lying = body[:offset] + struct.pack(">i", 2**31 - 1) + body[offset + 4 :]
    with pytest.raises(errors.InvalidRequestError, match="cannot hold"):
        dp.decode_fetch_request(lying, 3)


def test_session_errors_have_kafkas_codes_and_are_retriable():
    assert errors.for_kafka_code(70) is errors.FetchSessionIdNotFoundError
    assert errors.for_kafka_code(71) is errors.InvalidFetchSessionEpochError
    assert errors.FetchSessionIdNotFoundError.retriable and errors.InvalidFetchSessionEpochError.retriable
