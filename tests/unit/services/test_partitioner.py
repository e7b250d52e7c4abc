import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services import partitioner
from services.partitioner import StickyPartitioner, partition_for_key, py_murmur2
from services.records.record import load_speedups

#: Both implementations, whatever TRIBUTARY_NO_EXTENSIONS says (never a skip: a missing build fails).
_SPEEDUPS = load_speedups()
MURMUR2 = {"python": py_murmur2, "c": _SPEEDUPS.murmur2 if _SPEEDUPS is not None else None}


@pytest.fixture(params=sorted(MURMUR2))
def murmur2(request, monkeypatch):
    """Each test runs with the pure-Python murmur2 and the C accelerator's, and
    ``partition_for_key`` uses the same one."""
    implementation = MURMUR2[request.param]
    assert implementation is not None, "services.records._speedups is not built (see setup.py)"
    monkeypatch.setattr(partitioner, "murmur2", implementation)
    return implementation


# Kafka's own org.apache.kafka.common.utils.UtilsTest.testMurmur2 vectors (Java ints).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key, expected", KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(murmur2, key, expected):
    assert murmur2(key) == expected


def test_partition_for_key_uses_to_positive(murmur2):
    # -973932308 & 0x7fffffff = 1173551340
    assert partition_for_key(b"21", 1000) == 1173551340 % 1000
    assert partition_for_key(b"abc", 7) == 479470107 % 7


def _reference_murmur2(data: bytes) -> int:
    """Independent transcription of Java's loop with explicit 32-bit signed wraparound."""

    def i32(x):
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x >= 1 << 31 else x

    def ushr(x, n):
        return (x & 0xFFFFFFFF) >> n

    length = len(data)
    m, h = 0x5BD1E995, i32(0x9747B28C ^ length)
    for i in range(length // 4):
        b = data[i * 4 : i * 4 + 4]
        k = i32(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)
        k = i32(k * m)
        k = i32(k ^ ushr(k, 24))
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    base = length & ~3
    if length % 4 == 3:
        h = i32(h ^ (data[base + 2] << 16))
    if length % 4 >= 2:
        h = i32(h ^ (data[base + 1] << 8))
    if length % 4 >= 1:
        h = i32(h ^ data[base])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    return i32(h ^ ushr(h, 15))


@pytest.mark.parametrize("backend", sorted(MURMUR2))
@given(data=st.binary(max_size=64))
def test_murmur2_matches_reference_transcription(backend, data):
    implementation = MURMUR2[backend]
    assert implementation is not None, "services.records._speedups is not built (see setup.py)"
    assert implementation(data) == _reference_murmur2(data)


def test_murmur2_takes_any_bytes_like_key(murmur2):
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == KAFKA_VECTORS[b"foobar"]


def test_murmur2_refuses_what_is_not_bytes(murmur2):
    with pytest.raises(TypeError):
        murmur2("foobar")


def test_sticky_partitioner_sticks_then_moves():
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 8)
    assert all(sticky.partition("t", 8) == first for _ in range(100))
    for _ in range(50):
        previous = sticky.partition("t", 8)
        sticky.on_new_batch("t", 8, previous)
        assert sticky.partition("t", 8) != previous
    assert sticky.partition("t", 1) == 0
