"""Batch payload compression, written the way Kafka's Java client writes it.

The records of a compressed batch are one compressed blob after the 61-byte header. Per codec:

* **gzip** -- one gzip member (RFC 1952) at level 6, Java's ``Deflater.DEFAULT_COMPRESSION``.
  Reading accepts concatenated members, as ``java.util.zip.GZIPInputStream`` does.
* **snappy** -- xerial framing, as ``org.xerial.snappy.SnappyOutputStream`` writes it::

      magic   0x82 'S' 'N' 'A' 'P' 'P' 'Y' 0x00      8 bytes
      version int32 big-endian = 1
      compat  int32 big-endian = 1
      blocks  [int32 big-endian length][raw snappy block of <= 32 KiB input]...

  Reading accepts xerial framing and also a bare raw snappy block (``SnappyInputStream`` falls
  back to raw when the magic is absent). The version/compat ints are not checked: some producers
  (Redpanda) write them little-endian.
* **lz4** -- the LZ4 *frame* format with what ``Lz4BlockOutputStream`` writes: 64 KiB independent
  blocks, no block or content checksum, no content size. Reading accepts any valid frame(s).
* **zstd** -- a standard zstd frame at level 3 (Kafka's default). Reading accepts any frame(s).

Every decompressor is bounded: output beyond ``max_size`` (default
:data:`~services.records.format.MAX_DECOMPRESSED_SIZE`) is refused before it is allocated, and
truncated streams or trailing garbage are refused too. Every failure, whatever the library raises,
surfaces as :class:`~services.errors.CorruptRecordError` with the library error as its cause.

Thread-safe: the only state is one zstd compressor and decompressor per thread (a cache).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import lz4.frame
import snappy
import zstandard

from services.errors import CorruptRecordError
from services.records.format import MAX_DECOMPRESSED_SIZE, Compression

GZIP_LEVEL = 6
ZSTD_LEVEL = 3
_GZIP_WBITS = 31  # zlib's "gzip wrapper, 32 KiB window"

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
XERIAL_COMPAT_VERSION = 1
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", XERIAL_VERSION, XERIAL_COMPAT_VERSION)
#: SnappyOutputStream's default block size (uncompressed bytes per block).
XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")
#: Bounded decompressors produce output in steps of at most this many bytes.
_OUTPUT_STEP = 1024 * 1024


def compress(codec: Compression, data) -> bytes:
    """Compress a batch's record bytes with ``codec`` (``NONE`` returns the bytes unchanged)."""
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return zlib.compress(data, GZIP_LEVEL, _GZIP_WBITS)
    if codec == Compression.SNAPPY:
        return _xerial_compress(data)
    if codec == Compression.LZ4:
        return lz4.frame.compress(
            data,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
    if codec == Compression.ZSTD:
        return _zstd_compressor().compress(data)
    raise ValueError(f"unknown compression codec {codec!r}")


def decompress(codec: int, data, max_size: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress a batch payload; never returns (or allocates) more than ``max_size`` bytes.

    Raises :class:`CorruptRecordError` for an unknown codec id, malformed or truncated input,
    trailing garbage, or output larger than ``max_size``.
    """
    if codec == Compression.NONE:
        return bytes(data)
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise CorruptRecordError(f"unknown compression codec id {codec}")
    if not len(data):
        # An empty payload is an empty record set whatever the codec (Kafka skips decompressing
        # a batch whose record count is 0).
        return b""
    try:
        return decoder(data, max_size)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library has its own error types; all mean "bad payload"
        name = Compression(codec).name.lower()
        raise CorruptRecordError(f"{name} payload does not decompress: {exc!r}") from exc


def _too_large(max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"decompressed batch exceeds {max_size} bytes")


# --- gzip ------------------------------------------------------------------------------------


def _gzip_decompress(data, max_size: int) -> bytes:
    out: list[bytes] = []
    budget = max_size
    remaining = bytes(data)
    while remaining:
        decoder = zlib.decompressobj(_GZIP_WBITS)
        chunk = decoder.decompress(remaining, budget + 1)
        if len(chunk) > budget:
            raise _too_large(max_size)
        if not decoder.eof:
            raise CorruptRecordError("truncated gzip payload")
        out.append(chunk)
        budget -= len(chunk)
        remaining = decoder.unused_data
    return b"".join(out)


# --- snappy (xerial framing) -----------------------------------------------------------------


def _xerial_compress(data) -> bytes:
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    pack = _XERIAL_BLOCK_LENGTH.pack
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = snappy.compress(view[start : start + XERIAL_BLOCK_SIZE])
        parts.append(pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _raw_snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block declares in its varint preamble (<= 5 bytes)."""
    length = 0
    shift = 0
    for b in block[:5]:
        length |= (b & 0x7F) << shift
        if b < 0x80:
            return length
        shift += 7
    raise CorruptRecordError("bad snappy length preamble")


def _raw_snappy_decompress(block: bytes, budget: int, max_size: int) -> bytes:
    # Check the declared size first so a hostile preamble cannot make the library allocate it.
    if _raw_snappy_length(block) > budget:
        raise _too_large(max_size)
    return snappy.uncompress(block)


def _snappy_decompress(data, max_size: int) -> bytes:
    data = bytes(data)  # the compressed payload: small, and bytes slices cheaply below
    if not data.startswith(XERIAL_MAGIC) or len(data) < len(XERIAL_HEADER):
        return _raw_snappy_decompress(data, max_size, max_size)
    out: list[bytes] = []
    budget = max_size
    pos = len(XERIAL_HEADER)
    end = len(data)
    while pos < end:
        if end - pos < _XERIAL_BLOCK_LENGTH.size:
            raise CorruptRecordError("truncated xerial snappy block length")
        (block_length,) = _XERIAL_BLOCK_LENGTH.unpack_from(data, pos)
        pos += _XERIAL_BLOCK_LENGTH.size
        if block_length < 0 or block_length > end - pos:
            raise CorruptRecordError(f"xerial snappy block length {block_length} out of bounds")
        chunk = _raw_snappy_decompress(data[pos : pos + block_length], budget, max_size)
        out.append(chunk)
        budget -= len(chunk)
        pos += block_length
    return out[0] if len(out) == 1 else b"".join(out)


# --- lz4 frame -------------------------------------------------------------------------------


def _lz4_decompress(data, max_size: int) -> bytes:
    out: list[bytes] = []
    budget = max_size
    remaining = bytes(data)
    while remaining:
        decoder = lz4.frame.LZ4FrameDecompressor()
        pending = remaining
        while True:
            # NOTE: in steps, because the library allocates max_length up front: asking for
            # max_size + 1 (64 MiB) at once made every batch ~8x slower to decode.
            chunk = decoder.decompress(pending, max_length=min(budget + 1, _OUTPUT_STEP))
            pending = b""
            budget -= len(chunk)
            if budget < 0:
                raise _too_large(max_size)
            out.append(chunk)
            if decoder.eof:
                break
            if decoder.needs_input:
                raise CorruptRecordError("truncated lz4 frame")
        remaining = decoder.unused_data or b""
    return out[0] if len(out) == 1 else b"".join(out)


# --- zstd ------------------------------------------------------------------------------------


def _zstd_decompress(data, max_size: int) -> bytes:
    payload = bytes(data)
    dctx = _zstd_decompressor()
    # Pass 1 bounds the output: a streaming read in 1 MiB steps (discarded) stops as soon as the
    # total passes max_size, whatever sizes the frames declare. A streaming read cannot tell a
    # truncated frame from a complete one, hence pass 2.
    total = 0
    with dctx.stream_reader(payload, read_across_frames=True) as reader:
        while chunk := reader.read(_OUTPUT_STEP):
            total += len(chunk)
            if total > max_size:
                raise _too_large(max_size)
    # Pass 2, now known to be bounded, decodes frame by frame and checks each frame ends.
    out: list[bytes] = []
    while payload:
        decoder = dctx.decompressobj()
        out.append(decoder.decompress(payload))
        if not decoder.eof:
            raise CorruptRecordError("truncated zstd frame")
        payload = decoder.unused_data
    return b"".join(out)


# Creating a zstd (de)compressor costs ~7 us or more, as much as handling a typical batch; one of
# each is kept per thread because instances must not be used by two threads at once.


def _zstd_compressor() -> zstandard.ZstdCompressor:
    cctx = getattr(_thread_state, "zstd_compressor", None)
    if cctx is None:
        cctx = _thread_state.zstd_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return cctx


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_thread_state, "zstd_decompressor", None)
    if dctx is None:
        dctx = _thread_state.zstd_decompressor = zstandard.ZstdDecompressor()
    return dctx


_thread_state = threading.local()

_DECODERS: dict[int, Callable[[Any, int], bytes]] = {
    Compression.GZIP: _gzip_decompress,
    Compression.SNAPPY: _snappy_decompress,
    Compression.LZ4: _lz4_decompress,
    Compression.ZSTD: _zstd_decompress,
}
