"""Payload codecs: Kafka's framing on write, tolerant but bounded reads."""

from __future__ import annotations

import gzip
import struct
import zlib

import lz4.frame
import pytest
import snappy
import zstandard
from kafka import codec as kafka_codec

from services.errors import CorruptRecordError
from services.records import Compression
from services.records.compression import XERIAL_BLOCK_SIZE, compress, decompress

CODECS = [pytest.param(c, id=c.name.lower()) for c in Compression]
COMPRESSED = [pytest.param(c, id=c.name.lower()) for c in Compression if c != Compression.NONE]
DATA = b"".join(b"record %d says hello; " % i for i in range(5000))  # ~110 KB, 4 snappy blocks


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", [b"x", b"\x00" * 7, DATA], ids=["1B", "7B", "110KB"])
def test_round_trip(codec, data):
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_empty_payload_decompresses_to_nothing(codec):
    assert decompress(codec, b"") == b""


@pytest.mark.parametrize(
    ("name", "codec"),
    [("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4), ("ZSTD", 4), ("Snappy", 2)],
)
def test_from_name(name, codec):
    assert Compression.from_name(name) == codec


@pytest.mark.parametrize("name", ["", "lzma", "producer", "uncompressed", "brotli"])
def test_from_name_rejects_unknown(name):
    with pytest.raises(ValueError):
        Compression.from_name(name)


def test_snappy_writes_xerial_framing_in_32k_blocks():
    framed = compress(Compression.SNAPPY, DATA)
    assert framed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    blocks = []
    pos = 16
    while pos < len(framed):
        (length,) = struct.unpack_from(">i", framed, pos)
        blocks.append(snappy.uncompress(framed[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(framed)
    assert [len(b) for b in blocks] == [XERIAL_BLOCK_SIZE] * 3 + [len(DATA) - 3 * XERIAL_BLOCK_SIZE]
    assert b"".join(blocks) == DATA


def test_snappy_reads_raw_blocks_and_other_writers():
    assert decompress(Compression.SNAPPY, snappy.compress(DATA)) == DATA
    assert decompress(Compression.SNAPPY, kafka_codec.snappy_encode(DATA)) == DATA
    assert kafka_codec.snappy_decode(compress(Compression.SNAPPY, DATA)) == DATA
    # Redpanda writes the xerial version ints little-endian; they are not checked.
    framed = bytearray(compress(Compression.SNAPPY, DATA))
    framed[8:16] = struct.pack("<ii", 1, 1)
    assert decompress(Compression.SNAPPY, framed) == DATA


def test_lz4_writes_kafka_frame_descriptor():
    frame = compress(Compression.LZ4, DATA)
    assert frame[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic, little-endian 0x184D2204
    # FLG: version 01, independent blocks, no block/content checksum, no content size.
    assert frame[4] == 0b0110_0000
    assert frame[5] == 0x40  # BD: 64 KiB maximum block size
    assert frame[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum after it


def test_gzip_and_zstd_are_standard_frames():
    assert gzip.decompress(compress(Compression.GZIP, DATA)) == DATA
    assert zstandard.ZstdDecompressor().decompress(compress(Compression.ZSTD, DATA)) == DATA


@pytest.mark.parametrize(
    ("codec", "concatenated"),
    [
        pytest.param(Compression.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd"), id="gzip"),
        pytest.param(Compression.LZ4, lz4.frame.compress(b"ab") + lz4.frame.compress(b"cd"), id="lz4"),
        pytest.param(Compression.ZSTD, zstandard.compress(b"ab") + zstandard.compress(b"cd"), id="zstd"),
    ],
)
def test_concatenated_frames_are_read(codec, concatenated):
    assert decompress(codec, concatenated) == b"abcd"


@pytest.mark.parametrize("codec", COMPRESSED)
def test_output_is_bounded(codec):
    bomb = compress(codec, b"\x00" * 100_000)
    assert len(decompress(codec, bomb, max_size=100_000)) == 100_000
    with pytest.raises(CorruptRecordError, match="exceeds 99999 bytes"):
        decompress(codec, bomb, max_size=99_999)


def test_zstd_bomb_without_content_size_is_bounded():
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * 100_000)
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(Compression.ZSTD, bomb, max_size=1000)


def test_snappy_preamble_is_checked_before_decompressing():
    # A raw block claiming 2 GiB of output, inside xerial framing.
    block = b"\x80\x80\x80\x80\x08" + b"\x00"
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    with pytest.raises(CorruptRecordError, match="exceeds"):
        decompress(Compression.SNAPPY, framed)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_truncated_payload_is_corrupt(codec):
    payload = compress(codec, DATA)
    for cut in (1, len(payload) // 2, len(payload) - 1):
        with pytest.raises(CorruptRecordError):
            decompress(codec, payload[:cut])


@pytest.mark.parametrize("codec", COMPRESSED)
def test_trailing_garbage_is_corrupt(codec):
    with pytest.raises(CorruptRecordError):
        decompress(codec, compress(codec, DATA) + b"\x01garbage")


@pytest.mark.parametrize("codec", COMPRESSED)
@pytest.mark.parametrize("garbage", [b"\x05", b"\xff" * 40, bytes(range(256))], ids=["1B", "ff", "range"])
def test_garbage_is_corrupt(codec, garbage):
    with pytest.raises(CorruptRecordError):
        decompress(codec, garbage)


def test_xerial_block_lengths_are_bounded():
    header = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for tail in (struct.pack(">i", -1), struct.pack(">i", 1000) + b"abc", b"\x00\x00"):
        with pytest.raises(CorruptRecordError):
            decompress(Compression.SNAPPY, header + tail)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_id_is_corrupt(codec_id):
    with pytest.raises(CorruptRecordError, match="unknown compression"):
        decompress(codec_id, zlib.compress(b"x"))


def test_compress_rejects_unknown_codec():
    with pytest.raises(ValueError):
        compress(7, b"x")
