"""The C accelerator (``_speedups.c``) against the pure-Python reference, side by side.

Every case feeds one input to both implementations and requires the same result, or the same
exception type: :class:`CorruptRecordError` for bad bytes, ``TypeError``/``ValueError`` for bad
builder arguments. The inputs are random valid batches (1 to 1000 records), every truncation and
byte flip of small ones, every field of a record replaced by odd varints, random mutations, and
builder arguments of every unusual kind. The last tests check the extension is built and used,
and that its loops leak nothing.
"""

from __future__ import annotations

import array
import gc
import os
import random
import subprocess
import sys
import sysconfig

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import records
from services.errors import CorruptRecordError
from services.records import Record, RecordBatchBuilder, RecordBatchView
from services.records import builder as builder_module
from services.records import record as record_module

from .records_backends import require_speedups, use_backend
from .records_oracles import nullable, zigzag

py_decode = record_module.py_decode_records
py_validate = record_module.py_validate_records
T0 = 1_700_000_000_000


def _outcome(fn, *args, **kwargs):
    """``("ok", result)`` or ``("raised", exception type)``: what must match across backends."""
    try:
        return "ok", fn(*args, **kwargs)
    except (CorruptRecordError, IndexError, TypeError, ValueError, OverflowError, BufferError) as exc:
        return "raised", type(exc)


def _same_decode(data, *args) -> tuple:
    c = require_speedups()
    expected = _outcome(py_decode, data, *args)
    actual = _outcome(c.decode_records, data, *args)
    assert actual == expected, (bytes(data).hex(), args)
    if expected[0] == "ok":
        for record, reference in zip(actual[1], expected[1], strict=True):
            # Equal records must hash alike (CPython 3.14 caches a tuple's hash in the object).
            assert hash(record) == hash(reference)
            assert type(record) is Record
            assert record.key is None or type(record.key) is bytes
            assert record.value is None or type(record.value) is bytes
            assert type(record.headers) is tuple
    return expected


def _same_validate(data, count) -> tuple:
    """Both backends' validate_records agree, and what they accept both decoders decode: a
    record the storage node lets in can never fail a consumer."""
    c = require_speedups()
    expected = _outcome(py_validate, data, count)
    assert _outcome(c.validate_records, data, count) == expected, (bytes(data).hex(), count)
    if expected[0] == "ok":
        assert len(_same_decode(data, count, 0, T0, None, count - 1)[1]) == count
    return expected


def _same_window(data, count, base_offset, first_offset, max_records) -> tuple:
    """A windowed decode matches across backends and is the matching slice of the full one."""
    c = require_speedups()
    args = (data, count, base_offset, T0, None, 2**40, first_offset, max_records)
    expected = _outcome(py_decode, *args)
    assert _outcome(c.decode_records, *args) == expected, (bytes(data).hex(), args[1:])
    return expected


# --- random valid batches ----------------------------------------------------------------------


def _random_blob(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.2:
        return b""
    if roll < 0.9:
        return rng.randbytes(rng.randint(1, 70))
    return rng.randbytes(rng.choice([130, 8191, 8192, 20_000]))  # 2- and 3-byte lengths


def _random_headers(rng: random.Random) -> list:
    if rng.random() < 0.7:
        return []
    keys = ["", "h", "trace-id", "\u00e9t\u00e9", "\u65e5\u672c", "k" * 200]
    return [
        (rng.choice(keys), rng.choice([None, b"", rng.randbytes(rng.randint(1, 30))]))
        for _ in range(rng.randint(1, 4))
    ]


def _random_timestamp(rng: random.Random, base: int) -> int:
    spread = rng.choice([0, 5, 100, 10_000, 2**40, 2**61])
    return base + rng.randint(-spread, spread)  # negative deltas included


def _random_records(rng: random.Random, count: int) -> list[tuple]:
    base = rng.choice([T0, 0, -(2**61), 2**61])
    return [
        (_random_blob(rng), _random_timestamp(rng, base), _random_blob(rng), _random_headers(rng))
        for _ in range(count)
    ]


def _build(backend: str, entries: list[tuple], **builder_kwargs) -> bytes:
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_backend(monkeypatch, backend)
        builder = RecordBatchBuilder(**builder_kwargs)
        for value, timestamp, key, headers in entries:
            builder.append(value, timestamp=timestamp, key=key, headers=headers)
        return builder.build()


BATCH_SIZES = [1, 2, 3, 7, 50, 127, 128, 500, 999, 1000]


@pytest.mark.parametrize("size", BATCH_SIZES)
def test_random_valid_batches_encode_and_decode_the_same(size):
    rng = random.Random(size)
    for _ in range(3 if size > 100 else 20):
        entries = _random_records(rng, size)
        base_offset = rng.choice([0, 5, 2**40, 2**63 - size])
        data = _build("python", entries, base_offset=base_offset)
        assert _build("c", entries, base_offset=base_offset) == data
        view = RecordBatchView(data)
        payload = bytes(view.buffer[61:])
        expected = [
            Record(base_offset + delta, timestamp, key, value, tuple(headers))
            for delta, (value, timestamp, key, headers) in enumerate(entries)
        ]
        args = (size, base_offset, view.base_timestamp, None, size - 1)
        assert _same_decode(payload, *args) == ("ok", expected)
        assert _same_decode(payload, size, base_offset, view.base_timestamp, 12345, size - 1)[0] == "ok"
        assert _same_validate(payload, size) == ("ok", None)


@pytest.mark.parametrize("size", [1, 1000])
def test_random_batches_from_random_sizes_and_codecs(size):
    rng = random.Random(size + 1)
    for _ in range(10):
        count = rng.randint(1, size)
        entries = _random_records(rng, count)
        codec = rng.choice(list(records.Compression))
        data = _build("c", entries, compression=codec)
        assert data == _build("python", entries, compression=codec)


def test_other_buffers_decode_like_bytes():
    c = require_speedups()
    entries = _random_records(random.Random(7), 40)
    payload = _build("python", entries)[61:]
    args = (40, 0, entries[0][1], None, 39)
    expected = py_decode(payload, *args)
    assert c.decode_records(bytearray(payload), *args) == expected
    assert c.decode_records(memoryview(payload), *args) == expected
    assert c.decode_records(memoryview(b"junk" + payload + b"junk")[4:-4], *args) == expected
    assert c.validate_records(memoryview(payload), 40) is c.validate_records(bytearray(payload), 40) is None


def test_keyword_arguments_match():
    c = require_speedups()
    payload = _build("python", [(b"v", 5, b"k", [])])[61:]
    kwargs = {
        "data": payload,
        "count": 1,
        "base_offset": 9,
        "base_timestamp": 5,
        "log_append_time": None,
        "last_offset_delta": 0,
    }
    assert c.decode_records(**kwargs) == py_decode(**kwargs)
    assert c.validate_records(data=payload, count=1) is py_validate(data=payload, count=1) is None
    for bad in (dict(kwargs, extra=1), {k: v for k, v in kwargs.items() if k != "count"}):
        for fn in (c.decode_records, py_decode):
            with pytest.raises(TypeError):
                fn(**bad)
    with pytest.raises(TypeError):
        c.decode_records(payload, 1, 9, 5, None, 0, count=1)  # count given twice


@pytest.mark.parametrize(
    "base_offset", [0, -5, 2**63 - 1, -(2**63), 2**80, -(2**80)], ids=lambda v: f"base={v}"
)
def test_offsets_and_timestamps_beyond_int64_match(base_offset):
    # The C code adds in int64 when it can and falls back to Python's int arithmetic otherwise.
    entries = [(b"v", T0 + i, None, []) for i in range(3)] + [(b"w", T0 - 2**62, None, [])]
    payload = _build("python", entries)[61:]
    for base_timestamp in (T0, 2**63 - 1, -(2**63), 2**90):
        assert _same_decode(payload, 4, base_offset, base_timestamp, None, 3)[0] == "ok"


# --- malformed input ---------------------------------------------------------------------------


def _record(fields: dict) -> bytes:
    """A record from raw field encodings; ``length`` defaults to the right one."""
    body = (
        fields.get("attributes", b"\x00")
        + fields.get("timestamp_delta", zigzag(3))
        + fields.get("offset_delta", zigzag(0))
        + fields.get("key", nullable(b"key"))
        + fields.get("value", nullable(b"value"))
        + fields.get("headers", zigzag(1) + zigzag(1) + b"h" + nullable(b"x"))
    )
    return fields.get("length", zigzag(len(body))) + body


ODD_VARINTS = {
    "zero": b"\x00",
    "minus-one": b"\x01",
    "minus-two": b"\x03",
    "two-byte-zero": b"\x80\x00",
    "two-byte-minus-one": b"\x81\x00",
    "three-byte-minus-one": b"\x81\x80\x00",
    "two-byte-minus-two": b"\x83\x00",
    "two-byte-large": b"\xfe\x7f",
    "int32-max": b"\xfe\xff\xff\xff\x0f",
    "int32-min": b"\xff\xff\xff\xff\x0f",
    "varint-out-of-range": b"\xfe\xff\xff\xff\x1f",
    "varint-too-long": b"\x80\x80\x80\x80\x80\x00",
    "int64-max": b"\xfe" + b"\xff" * 8 + b"\x01",
    "int64-min": b"\xff" * 9 + b"\x01",
    "varlong-out-of-range": b"\xfe" + b"\xff" * 8 + b"\x03",
    "varlong-too-long": b"\x80" * 10 + b"\x00",
    "unterminated": b"\x80",
    "huge-positive": zigzag(2**30),
    "small": zigzag(4),
}
HEADER_FIELDS = {
    "header-count": lambda v: v + zigzag(1) + b"h" + nullable(b"x"),
    "header-key-length": lambda v: zigzag(1) + v + b"h" + nullable(b"x"),
    "header-value-length": lambda v: zigzag(1) + zigzag(1) + b"h" + v + b"x",
}


@pytest.mark.parametrize(
    "field", ["length", "timestamp_delta", "offset_delta", "key", "value", *HEADER_FIELDS]
)
@pytest.mark.parametrize("encoding", list(ODD_VARINTS.values()), ids=list(ODD_VARINTS))
def test_every_field_with_odd_varints(field, encoding):
    if field in HEADER_FIELDS:
        variants = [{"headers": HEADER_FIELDS[field](encoding)}]
    elif field in ("key", "value"):
        variants = [{field: encoding}, {field: encoding + b"abcd"}]  # with and without bytes behind
    else:
        variants = [{field: encoding}]
    for fields in variants:
        alone = _record(fields)
        second = _record({}) + _record(dict({"offset_delta": zigzag(1)}, **fields))
        for payload, count in ((alone, 1), (second, 2)):
            for count_arg in (count, count + 1):
                # A generous last offset delta lets a wrongly accepted huge offset delta through.
                for last_offset_delta in (5, 2**40):
                    _same_decode(payload, count_arg, 100, T0, None, last_offset_delta)
                _same_validate(payload, count_arg)
                _same_window(payload, count_arg, 100, 101, 1)


def _seed_payloads() -> list[tuple[bytes, int]]:
    entries = [
        (b"value-0", T0, b"k0", [("h", b"x"), ("\u00e9", None)]),
        (None, T0 + 1, b"k1", []),
        (b"", T0 - 7, None, [("", b"")]),
        (b"v" * 200, T0 + 2**33, b"k" * 70, []),
    ]
    return [(_build("python", entries[:n])[61:], n) for n in (1, 2, 4)]


def test_every_truncation_and_extension():
    for payload, count in _seed_payloads():
        for cut in range(len(payload) + 1):
            for data in (payload[:cut], payload[:cut] + b"\x00", payload[cut:]):
                for count_arg in (count, count - 1, 1):
                    _same_decode(data, count_arg, 0, T0, None, count - 1)
                    _same_validate(data, count_arg)
                    _same_window(data, count_arg, 0, count - 1, 1)
        _same_decode(payload + b"\x00", count, 0, T0, None, count - 1)
        _same_decode(payload + payload[:5], count, 0, T0, None, count - 1)


def test_every_byte_flipped():
    for payload, count in _seed_payloads():
        for position in range(len(payload)):
            for mask in (0x01, 0x02, 0x40, 0x7F, 0x80, 0xFF):
                data = bytearray(payload)
                data[position] ^= mask
                _same_decode(bytes(data), count, 0, T0, None, count - 1)
                _same_validate(bytes(data), count)
                _same_window(bytes(data), count, 0, 1, 2)


def test_random_mutations():
    rng = random.Random(2024)
    seeds = _seed_payloads()
    for _ in range(4000):
        payload, count = rng.choice(seeds)
        data = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(data) + 1)
            roll = rng.random()
            if roll < 0.5 and position < len(data):
                data[position] = rng.randrange(256)
            elif roll < 0.75:
                data[position:position] = rng.randbytes(rng.randint(1, 6))
            else:
                del data[position : position + rng.randint(1, 6)]
        _same_decode(bytes(data), count, 0, T0, rng.choice([None, T0]), count - 1)
        _same_validate(bytes(data), count)
        _same_window(bytes(data), count, 0, rng.randint(-1, count), rng.choice([None, 1, 2, 5]))


@pytest.mark.parametrize("count", [0, -1, -(2**70), 3, 4, 5, 6, 2**31 - 1, 2**40, 2**70])
@pytest.mark.parametrize("last_offset_delta", [-2, -1, 0, 2, 3, 2**40])
def test_counts_and_last_offset_deltas(count, last_offset_delta):
    payload, _ = _seed_payloads()[-1]  # four records
    _same_decode(payload, count, 0, T0, None, last_offset_delta)
    _same_decode(b"", count, 0, T0, None, last_offset_delta)


@pytest.mark.parametrize("first_offset", [None, -(2**70), 99, 100, 101, 102, 103, 104, 2**70])
@pytest.mark.parametrize("max_records", [None, 1, 2, 3, 4, 5, 2**70])
def test_decode_windows_are_slices_of_the_whole(first_offset, max_records):
    for payload, count in _seed_payloads():
        whole = py_decode(payload, count, 100, T0, None, count - 1)
        wanted = [r for r in whole if first_offset is None or r.offset >= first_offset][:max_records]
        assert _same_window(payload, count, 100, first_offset, max_records) == ("ok", wanted)


def test_decode_window_stops_reading_where_it_is_full():
    payload, count = _seed_payloads()[-1]  # four records; break the last one
    broken = payload[:-1] + b"\x7f"
    assert _same_window(broken, count, 0, None, None) == ("raised", CorruptRecordError)
    assert _same_window(broken, count, 0, None, 3)[0] == "ok"
    assert _same_window(broken, count, 0, 1, 3)[0] == "raised"  # the window reaches it


@pytest.mark.parametrize("max_records", [0, -1, -(2**70)])
def test_decode_window_of_no_records_is_a_caller_bug(max_records):
    payload, count = _seed_payloads()[0]
    assert _same_window(payload, count, 0, None, max_records) == ("raised", ValueError)


def test_offset_deltas_must_be_the_record_index():
    records_ = [_record({"offset_delta": zigzag(d)}) for d in (0, 1, 2)]
    assert _same_validate(b"".join(records_), 3) == ("ok", None)
    for deltas in ((0, 0, 1), (0, 2, 3), (1, 2, 3), (0, 1, 1), (0, 2, 1)):
        payload = b"".join(_record({"offset_delta": zigzag(d)}) for d in deltas)
        assert _same_validate(payload, 3) == ("raised", CorruptRecordError), deltas


@pytest.mark.parametrize(
    "headers",
    [
        zigzag(10**6),  # the count alone: a million headers in a few bytes
        zigzag(3) + zigzag(1) + b"h" + nullable(b"x"),  # more than are there
        zigzag(1) + zigzag(5) + b"h" + nullable(b"x"),  # key length past the record
        zigzag(1) + zigzag(1) + b"\xff" + nullable(b"x"),  # key not UTF-8
        zigzag(1) + zigzag(1) + b"h" + zigzag(9) + b"x",  # value length past the record
        zigzag(1) + zigzag(-1) + nullable(b"x"),  # a null key
    ],
    ids=["million", "too-many", "key-overrun", "key-not-utf8", "value-overrun", "null-key"],
)
def test_malformed_headers_are_refused(headers):
    assert _same_validate(_record({"headers": headers}), 1) == ("raised", CorruptRecordError)


def test_key_running_past_its_record_is_refused():
    # The record length is right for the bytes, the key length says more: framing alone passes it.
    body = b"\x00" + zigzag(0) + zigzag(0) + zigzag(40) + b"key" + nullable(b"v") + zigzag(0)
    assert _same_validate(zigzag(len(body)) + body, 1) == ("raised", CorruptRecordError)


@settings(max_examples=500, deadline=None)
@given(
    data=st.binary(max_size=120),
    count=st.integers(-1, 12),
    last=st.integers(-1, 12),
    append_time=st.sampled_from([None, 7]),
)
def test_arbitrary_bytes(data, count, last, append_time):
    _same_decode(data, count, 3, T0, append_time, last)
    _same_validate(data, count)
    _same_window(data, count, 3, 4, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-3, 2**32),
            st.binary(max_size=9),
            st.sampled_from(list(ODD_VARINTS.values())),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_structured_records_with_odd_fields(fields):
    """Records whose deltas, lengths and headers are random varints: deeper than random bytes."""
    payload = b"".join(
        _record(
            {
                "timestamp_delta": zigzag(ts),
                "offset_delta": zigzag(delta % 2**31 if delta >= 0 else -1),
                "value": nullable(blob),
                "headers": odd,
            }
        )
        for ts, delta, blob, odd in fields
    )
    _same_decode(payload, len(fields), 0, 0, None, 2**31)
    _same_validate(payload, len(fields))
    _same_window(payload, len(fields), 0, 2**30, 1)


def test_bad_data_types():
    c = require_speedups()
    for data in ("text", 12, None, [1, 2, 3]):
        with pytest.raises(TypeError):
            c.decode_records(data, 1, 0, 0, None, 0)
        with pytest.raises(TypeError):
            c.validate_records(data, 1)
    with pytest.raises(TypeError):
        c.decode_records(b"", "1", 0, 0, None, 0)
    with pytest.raises(TypeError):
        c.validate_records(b"", "1")
    for window in (("1", None), (None, "1"), (1.5, None)):
        with pytest.raises(TypeError):
            c.decode_records(b"", 0, 0, 0, None, 0, *window)


# --- the builder -------------------------------------------------------------------------------


class _Int(int):
    pass


class _Bytes(bytes):
    def __len__(self) -> int:  # builder.py takes len() of bytes subclasses: the C code must not
        return 2


def _appends(records_bytearray_holder):
    """Append calls to compare; ``records_bytearray_holder`` gives a builder's own bytearray."""
    b = b"v"
    return {
        "plain": {"value": b, "timestamp": 1001, "key": b"k"},
        "null-key-and-value": {"value": None, "timestamp": 1001, "key": None},
        "negative-delta": {"value": b, "timestamp": -5},
        "large-deltas": {"value": b, "timestamp": 2**62},
        "big-value": {"value": b"x" * 20_000, "timestamp": 1001, "key": b"y" * 9000},
        "bytearray": {"value": bytearray(b"ba"), "timestamp": 1001, "key": bytearray()},
        "memoryview": {"value": memoryview(b"abcdef"), "timestamp": 1001},
        "strided-memoryview": {"value": memoryview(b"abcdef")[::2], "timestamp": 1001},
        "int-memoryview": {"value": memoryview(b"\x01\x02\x03\x04").cast("I"), "timestamp": 1001},
        "array": {"value": array.array("H", [1, 2, 3]), "timestamp": 1001},
        "bytes-subclass": {"value": _Bytes(b"abcdef"), "timestamp": 1001},
        "str-value": {"value": "text", "timestamp": 1001},
        "str-key": {"value": b, "timestamp": 1001, "key": "text"},
        "int-value": {"value": 5, "timestamp": 1001},
        "headers": {"value": b, "timestamp": 1001, "headers": [("a", b"1"), ("", None), ("\u00fc", b"")]},
        "headers-tuple": {"value": b, "timestamp": 1001, "headers": (("a", b"1"),)},
        "headers-list-pairs": {"value": b, "timestamp": 1001, "headers": [["a", b"1"]]},
        "headers-bytearray-value": {"value": b, "timestamp": 1001, "headers": [("a", bytearray(b"1"))]},
        "headers-memoryview-value": {"value": b, "timestamp": 1001, "headers": [("a", memoryview(b"1"))]},
        "headers-none": {"value": b, "timestamp": 1001, "headers": None},
        "headers-generator": {"value": b, "timestamp": 1001, "headers": (h for h in [("a", b"1")])},
        "headers-dict": {"value": b, "timestamp": 1001, "headers": {"ab": b"1"}},
        "headers-many": {"value": b, "timestamp": 1001, "headers": [(f"h{i}", b"x" * i) for i in range(300)]},
        "header-bytes-key": {"value": b, "timestamp": 1001, "headers": [(b"a", b"1")]},
        "header-str-value": {"value": b, "timestamp": 1001, "headers": [("a", "1")]},
        "header-surrogate-key": {"value": b, "timestamp": 1001, "headers": [("\udc80", b"1")]},
        "header-one-item": {"value": b, "timestamp": 1001, "headers": [("a",)]},
        "header-three-items": {"value": b, "timestamp": 1001, "headers": [("a", b"1", b"2")]},
        "header-int-value": {"value": b, "timestamp": 1001, "headers": [("a", 1)]},
        "float-timestamp": {"value": b, "timestamp": 1.5},
        "bool-timestamp": {"value": b, "timestamp": True},
        "int-subclass-timestamp": {"value": b, "timestamp": _Int(1002)},
        "timestamp-too-big": {"value": b, "timestamp": 2**63},
        "timestamp-too-small": {"value": b, "timestamp": -(2**63) - 1},
        "delta-overflow": {"value": b, "timestamp": -(2**63)},
        "own-buffer-as-value": {"value": records_bytearray_holder, "timestamp": 1001},
        "own-buffer-view-as-key": {"value": b, "timestamp": 1001, "key": "view-of-own-buffer"},
        "own-buffer-as-header-value": {
            "value": b,
            "timestamp": 1001,
            "headers": [("a", records_bytearray_holder)],
        },
    }


def _builder_state(builder: RecordBatchBuilder) -> tuple:
    return (builder.record_count, builder._base_timestamp, builder._max_timestamp, bytes(builder._records))


@pytest.mark.parametrize("name", list(_appends(None)))
@pytest.mark.parametrize("history", ["empty", "one-record", "at-int64-max"])
def test_builder_append_matches(name, history):
    states = []
    for backend in ("python", "c"):
        with pytest.MonkeyPatch.context() as monkeypatch:
            use_backend(monkeypatch, backend)
            builder = RecordBatchBuilder()
            if history == "one-record":
                builder.append(b"first", timestamp=1000, key=b"k")
            elif history == "at-int64-max":
                builder.append(b"first", timestamp=2**63 - 1)
            kwargs = dict(_appends(builder._records)[name])
            view = None
            if kwargs.get("key") == "view-of-own-buffer":
                kwargs["key"] = view = memoryview(builder._records)
            outcome = _outcome(builder.append, kwargs.pop("value"), **kwargs)
            if view is not None:
                view.release()
            state = _builder_state(builder)
            built = _outcome(builder.build)
            states.append((outcome, state, built))
    assert states[0] == states[1]


def test_more_than_8192_records_match():
    entries = [(b"", i * 3 - 5000, None, []) for i in range(9000)]
    assert _build("c", entries) == _build("python", entries)


NULLABLE_BLOBS = st.one_of(st.none(), st.binary(max_size=300))
HEADER_LISTS = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(NULLABLE_BLOBS, st.integers(-(2**62), 2**62), NULLABLE_BLOBS, HEADER_LISTS),
        min_size=1,
        max_size=20,
    )
)
def test_builder_bytes_match_for_any_records(entries):
    # Timestamps 2**63 apart overflow the int64 delta: both backends must refuse them alike.
    assert _build_outcome("c", entries) == _build_outcome("python", entries)


def _build_outcome(backend: str, entries: list[tuple]) -> bytes | str:
    try:
        return _build(backend, entries)
    except ValueError as exc:
        return f"ValueError: {exc}"


def test_append_record_declines_without_writing():
    c = require_speedups()
    buffer = bytearray(b"prefix")
    declined = [
        (2**63, 0, 0, None, b"v", ()),  # timestamp out of int64
        (0, 0, 2**31 - 1, None, b"v", ()),  # offset delta beyond int32 - 1
        (0, 0, -1, None, b"v", ()),
        (0, 0, 0, "k", b"v", ()),
        (0, 0, 0, None, b"v", [("k", "v")]),
        (0, 0, 0, None, b"v", iter(())),
    ]
    for args in declined:
        assert c.append_record(buffer, *args) is False, args
        assert buffer == b"prefix"
    with memoryview(buffer) as export:  # an export of the buffer blocks the resize
        assert c.append_record(buffer, 0, 0, 0, None, export, ()) is False
        assert c.append_record(buffer, 0, 0, 0, None, b"v", [("h", buffer)]) is False
    assert buffer == b"prefix"
    assert c.append_record(buffer, 5, 5, 0, None, b"v", ()) is True
    assert buffer == b"prefix" + b"\x0e\x00\x00\x00\x01\x02v\x00"
    with pytest.raises(TypeError):
        c.append_record(b"bytes", 0, 0, 0, None, b"v", ())
    with pytest.raises(TypeError):
        c.append_record(buffer, 0, 0, 0, None, b"v")


# --- the extension itself ----------------------------------------------------------------------


def test_extension_is_built_and_used_unless_disabled():
    speedups = require_speedups()
    assert speedups.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    disabled = bool(os.environ.get("TRIBUTARY_NO_EXTENSIONS"))
    assert records.speedups_enabled() is not disabled
    assert (record_module.decode_records is speedups.decode_records) is not disabled
    assert (record_module.validate_records is speedups.validate_records) is not disabled
    assert (builder_module._append_record is speedups.append_record) is not disabled


@pytest.mark.parametrize(("value", "enabled"), [("1", False), ("yes", False), ("", True)])
def test_environment_variable_selects_the_backend(value, enabled):
    env = dict(os.environ, TRIBUTARY_NO_EXTENSIONS=value)
    code = "import services.records as r; print(r.speedups_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(enabled)


def test_init_rejects_classes_it_cannot_instantiate():
    c = require_speedups()
    for record_type in (list, dict, int, type("WithDict", (tuple,), {})):
        with pytest.raises(TypeError):
            c.init(record_type, CorruptRecordError)
    with pytest.raises(TypeError):
        c.init(Record, int)
    c.init(Record, CorruptRecordError)  # unchanged after the failures
    assert type(c.decode_records(b"\x10\x00\x00\x00\x02a\x02b\x00", 1, 0, 0, None, 0)[0]) is Record


def _allocated_blocks_growth(fn, rounds: int = 2000) -> int:
    fn()  # warm caches (interned strings, free lists)
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(rounds):
        fn()
    gc.collect()
    return sys.getallocatedblocks() - before


def test_no_leaks_on_success_or_error_paths():
    c = require_speedups()
    payload, count = _seed_payloads()[-1]
    bad_utf8 = _record({"headers": zigzag(1) + zigzag(1) + b"\xff" + nullable(b"x")})
    big_delta = _record({"offset_delta": zigzag(1000)})  # ints above 256 are not cached singletons
    calls = [
        lambda: c.decode_records(payload, count, 2**70, T0, None, count - 1),
        lambda: c.decode_records(big_delta, 1, 0, T0, None, 1000),
        lambda: _outcome(c.decode_records, payload[:-1], count, 0, T0, None, count - 1),
        lambda: _outcome(c.decode_records, payload, count, 0, T0, None, 0),
        lambda: _outcome(c.decode_records, bad_utf8, 1, 0, T0, None, 0),
        lambda: _outcome(c.decode_records, payload + b"\x00", count, 0, T0, None, count - 1),
        lambda: c.validate_records(payload, count),
        lambda: _outcome(c.validate_records, payload[:-1], count),
        lambda: _outcome(c.validate_records, bad_utf8, 1),
        lambda: _outcome(c.validate_records, _record({"headers": "\u00e9".encode() * 2}), 1),
        lambda: c.decode_records(payload, count, 2**70, T0, None, count - 1, 2**70 + 2, 1),
        lambda: _outcome(c.decode_records, payload[:-1], count, 0, T0, None, count - 1, 2),
        lambda: _outcome(c.decode_records, payload, count, 0, T0, None, count - 1, None, 0),
        lambda: c.append_record(bytearray(), T0, T0 - 5, 0, b"k", bytearray(b"v"), [("h", None)]),
        lambda: c.append_record(bytearray(), T0, T0, 0, b"k", memoryview(b"v")[::-1], ()),
        lambda: c.append_record(bytearray(), T0, T0, 0, array.array("b", [1]), b"v", [("h", "str")]),
        lambda: c.murmur2(b"a-little-bit-longer-string"),
        lambda: c.murmur2(memoryview(b"abcdefg")[1:]),
        lambda: _outcome(c.murmur2, "not bytes"),
    ]
    for call in calls:
        assert _allocated_blocks_growth(call) < 100, call
