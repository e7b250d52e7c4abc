"""``as_consumer_records``: the accelerator's version against the Python reference.

The consumer turns each decoded batch's ``Record`` tuples into ``ConsumerRecord``s in place
(``gateway/client/fetcher.py``); the C version must give equal records of the same type, refuse
arguments it cannot build from, leave records of atomic fields untracked by the garbage
collector (and keep the others tracked), and leak nothing.
"""

from __future__ import annotations

import gc
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client import fetcher
from gateway.client.structs import ConsumerRecord
from services.records import Record

from ..services.records.records_backends import require_speedups

py_as = fetcher.py_as_consumer_records

headers = st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=4))), max_size=3)
records = st.lists(
    st.builds(
        Record,
        st.integers(min_value=0, max_value=2**70),
        st.integers(min_value=-(2**65), max_value=2**65),
        st.one_of(st.none(), st.binary(max_size=8)),
        st.one_of(st.none(), st.binary(max_size=8)),
        headers.map(tuple),
    ),
    max_size=40,
)


def _both(rows: list, *args) -> tuple[list, list]:
    c = require_speedups()
    expected, actual = list(rows), list(rows)
    py_as(expected, *args)
    c.as_consumer_records(actual, *args)
    return expected, actual


@settings(max_examples=200, deadline=None)
@given(
    rows=records,
    topic=st.text(max_size=5),
    partition=st.integers(0, 2**31),
    timestamp_type=st.sampled_from([0, 1]),
)
def test_c_and_python_make_the_same_consumer_records(rows, topic, partition, timestamp_type):
    expected, actual = _both(rows, ConsumerRecord, topic, partition, timestamp_type)
    assert actual == expected
    for made, reference in zip(actual, expected, strict=True):
        assert type(made) is ConsumerRecord
        assert hash(made) == hash(reference)
        assert made.topic_partition == reference.topic_partition


def test_the_fetcher_uses_the_accelerator_unless_disabled():
    from services.records import record

    assert (fetcher.as_consumer_records is py_as) is (record.speedups is None)


def test_records_of_atomic_fields_are_untracked_and_others_tracked():
    c = require_speedups()
    cyclic: list = []
    rows = [
        Record(5, 10, b"k", b"v", ()),
        Record(6, 11, None, None, (("h", b"x"), ("i", None))),
        Record(7, 12, None, b"v", (("h", cyclic),)),  # a list in the headers: could hold a cycle
    ]
    gc.collect()  # the header tuples above become untracked where they can
    c.as_consumer_records(rows, ConsumerRecord, "t", 0, 0)
    assert [gc.is_tracked(r) for r in rows] == [False, False, True]
    cyclic.append(rows[2])  # the collector still sees the cycle through the tracked record
    del rows, cyclic
    assert gc.collect() > 0


@pytest.mark.parametrize(
    ("rows", "consumer_type", "error"),
    [
        ((), ConsumerRecord, TypeError),  # not a list
        ([(1, 2, 3)], ConsumerRecord, TypeError),  # not a 5-field Record
        (["abcde"], ConsumerRecord, TypeError),
        ([Record(0, 0, None, None, ())], list, TypeError),
        ([Record(0, 0, None, None, ())], type("WithDict", (tuple,), {}), TypeError),
    ],
)
def test_bad_arguments_are_refused(rows, consumer_type, error):
    # Only the fetcher calls it, with decoded batches: a wrong argument is a bug, refused before
    # it could build a malformed tuple (the reference would build odd records or IndexError).
    c = require_speedups()
    with pytest.raises(error):
        c.as_consumer_records(rows, consumer_type, "t", 0, 0)


def test_nothing_leaks():
    c = require_speedups()
    rows = [Record(1000 + i, 2**40 + i, b"k" * i, b"v" * i, (("h", b"x"),)) for i in range(50)]

    def once() -> None:
        c.as_consumer_records(list(rows), ConsumerRecord, "topic", 3, 0)
        try:
            c.as_consumer_records([*rows, (1,)], ConsumerRecord, "topic", 3, 0)
        except TypeError:
            pass

    once()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(2000):
        once()
    gc.collect()
    assert sys.getallocatedblocks() - before < 100
