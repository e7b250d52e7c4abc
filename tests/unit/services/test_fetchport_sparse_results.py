"""How the fetch-port client places a version-3 (sparse) answer's partitions on its request."""

from __future__ import annotations

import pytest

from services import errors
from services.fetchport import multi
from services.fetchport.client import _sparse_results

ASKED = tuple(
    multi.PartitionFetch(topic, n, 0, 100, known_high_watermark=5) for topic in "ab" for n in range(3)
)


def _answer(*keys: tuple[str, int], error_code: int = 0) -> multi.MultiFetchResponse:
    return multi.MultiFetchResponse(
        7,
        error_code,
        "",
        tuple(
            multi.PartitionData(multi.PartitionHeader(t, n, high_watermark=9), memoryview(b""))
            for t, n in keys
        ),
    )


def _request() -> multi.MultiFetchRequest:
    return multi.MultiFetchRequest(7, -1, ASKED, 1000, sparse=True)


@pytest.mark.parametrize(
    "keys",
    [(), (("a", 0),), (("b", 2),), (("a", 1), ("b", 0)), tuple((t, n) for t in "ab" for n in range(3))],
)
def test_answered_partitions_land_at_their_place_and_the_others_are_none(keys):
    results = _sparse_results(_answer(*keys), _request())
    assert len(results) == len(ASKED)
    for fetch, result in zip(ASKED, results, strict=True):
        if (fetch.topic, fetch.partition) in keys:
            assert result is not None and result.header.high_watermark == 9 and result.header.error_code == 0
        else:
            assert result is None


@pytest.mark.parametrize(
    "keys",
    [
        (("b", 0), ("a", 1)),  # out of order
        (("a", 1), ("a", 1)),  # twice
        (("c", 0),),  # not asked for
        (("a", 2), ("a", 3)),  # a partition number not asked for
    ],
)
def test_an_answer_out_of_order_or_not_asked_for_fails_every_partition(keys):
    results = _sparse_results(_answer(*keys), _request())
    assert all(r is not None and r.header.error_code == errors.CorruptRecordError.kafka_code for r in results)


def test_a_request_level_error_fails_every_partition():
    code = errors.UnknownServerError.kafka_code
    results = _sparse_results(_answer(error_code=code), _request())
    assert all(r is not None and r.header.error_code == code for r in results)
