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
from services.errors import CorruptRecordError
from services.records import Record, RecordBatchBuilder, RecordBatchView, set_log_append_time

from ..services.records.records_backends import BACKENDS, require_speedups, use_backend

T0 = 1_700_000_000_000

py_as = fetcher.py_as_consumer_records  # services.records.record

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


# --- RecordBatchView.read_consumer_records: decode and build in one pass ----------------------


def _batch(values: list, base_offset: int, *, log_append_time: bool = False) -> bytes:
    builder = RecordBatchBuilder(base_offset=base_offset)
    for i, value in enumerate(values):
        builder.append(
            value, key=None if i % 3 else b"k%d" % i, timestamp=T0 + i, headers=[("h", value)] * (i % 2)
        )
    data = bytearray(builder.build())
    if log_append_time:
        set_log_append_time(data, T0 + 99)
    return bytes(data)


def _read(backend: str, data: bytes, first_offset):
    with pytest.MonkeyPatch.context() as patch:
        use_backend(patch, backend)
        try:
            return "ok", RecordBatchView(data).read_consumer_records(
                ConsumerRecord, "t", 7, first_offset=first_offset
            )
        except CorruptRecordError as exc:
            return "raised", type(exc)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.binary(max_size=6), min_size=1, max_size=30),
    base_offset=st.integers(0, 2**40),
    skip=st.one_of(st.none(), st.integers(-3, 40)),
    log_append_time=st.booleans(),
)
def test_read_consumer_records_is_read_records_made_consumer_records(
    values, base_offset, skip, log_append_time
):
    data = _batch(values, base_offset, log_append_time=log_append_time)
    first_offset = None if skip is None else base_offset + skip
    view = RecordBatchView(data)
    expected = [
        ConsumerRecord("t", 7, r.offset, r.timestamp, int(view.timestamp_type), r.key, r.value, r.headers)
        for r in view.read_records(first_offset=first_offset)
    ]
    for backend in BACKENDS:
        assert _read(backend, data, first_offset) == ("ok", expected), backend


def test_read_consumer_records_fails_as_read_records_does():
    data = _batch([b"a", b"bb", b"ccc"], 10)  # the last record has no headers: its last byte is 0
    damaged = [data[:-1] + b"\x02", data[:-1] + b"\x01", data[:-3] + b"\x01\x02\x03"]
    for bad in damaged:
        outcomes = {backend: _read(backend, bad, None) for backend in BACKENDS}
        assert outcomes["c"] == outcomes["python"] == ("raised", CorruptRecordError), bad.hex()


def test_the_collector_runs_again_after_a_decode_either_way():
    assert gc.isenabled()
    data = _batch([b"v"] * 51, 0)  # the last record has no headers: its last byte is 0
    assert _read("c", data, None)[0] == "ok"
    assert gc.isenabled()
    assert _read("c", data[:-1] + b"\x02", None)[0] == "raised"
    assert gc.isenabled()
    gc.disable()
    try:
        _read("c", data, None)
        assert not gc.isenabled()  # an application's own choice is kept
    finally:
        gc.enable()
    decoded = _read("c", data, None)[1]
    assert not any(gc.is_tracked(r) for r in decoded)
