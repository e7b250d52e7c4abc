"""The data connection's frame reader (``gateway/client/answer_reader.py``) fed the way asyncio
feeds a BufferedProtocol: ``get_buffer`` then ``buffer_updated`` with what the socket gave, in
chunks of every size. Pure logic: a fake transport, no socket."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from gateway.client.answer_reader import AnswerReader
from services import errors


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def feed(reader: AnswerReader, data: bytes, chunk_sizes) -> None:
    """Give ``data`` to the reader as a socket would: at most the buffer it offers per read."""
    view = memoryview(data)
    while view:
        buffer = reader.get_buffer(-1)
        n = min(len(buffer), len(view), next(chunk_sizes))
        buffer[:n] = view[:n]
        reader.buffer_updated(n)
        view = view[n:]


def make_reader(loop, buffer_size=64, max_frame=1 << 20):
    reader = AnswerReader(loop, buffer_size=buffer_size, max_frame=max_frame, first_max=32)
    transport = _Transport()
    reader.connection_made(transport)
    got: list[bytes] = []
    lost: list[BaseException] = []
    feed(reader, frame(b"hello"), iter([1 << 30]))
    assert reader.first.result() == b"hello"
    reader.attach(lambda body: got.append(bytes(body)), lost.append)
    return reader, transport, got, lost


@pytest.mark.parametrize("seed", range(20))
def test_frames_of_every_size_in_chunks_of_every_size_come_out_whole_and_in_order(seed):
    rng = random.Random(seed)
    loop = asyncio.new_event_loop()
    try:
        reader, transport, got, lost = make_reader(loop, buffer_size=64)
        bodies = [
            bytes(rng.randrange(256) for _ in range(rng.choice([1, 5, 59, 60, 61, 64, 200, 1000])))
            for _ in range(60)
        ]
        chunks = iter(lambda: rng.choice([1, 2, 3, 7, 64, 500, 1 << 20]), None)
        feed(reader, b"".join(frame(b) for b in bodies), chunks)
        assert got == bodies
        assert not lost and not transport.aborted
    finally:
        loop.close()


def test_a_frame_larger_than_the_buffer_is_received_into_a_buffer_of_its_own_size():
    loop = asyncio.new_event_loop()
    try:
        reader, _, got, _ = make_reader(loop, buffer_size=64)
        large = bytes(range(256)) * 40
        feed(reader, frame(b"small") + frame(large) + frame(b"after"), iter([30] + [1 << 30] * 10))
        # After the first 30 bytes, the reader offers exactly the rest of the large frame.
        assert got == [b"small", large, b"after"]
    finally:
        loop.close()


def test_a_large_frame_s_buffer_is_exactly_what_remains_of_it():
    loop = asyncio.new_event_loop()
    try:
        reader, *_ = make_reader(loop, buffer_size=64)
        data = frame(b"x" * 1000)
        buffer = reader.get_buffer(-1)
        buffer[:40] = data[:40]
        reader.buffer_updated(40)
        assert len(reader.get_buffer(-1)) == 1004 - 40, "the next read stops at the frame's end"
    finally:
        loop.close()


@pytest.mark.parametrize("size", [0, (1 << 20) + 1, 0xFFFFFFFF])
def test_a_length_prefix_outside_the_bound_ends_the_connection_without_allocating(size):
    loop = asyncio.new_event_loop()
    try:
        reader, transport, got, lost = make_reader(loop)
        feed(reader, frame(b"ok") + struct.pack(">I", size) + b"zz", iter([1 << 30]))
        assert got == [b"ok"]
        assert transport.aborted
        assert len(lost) == 1 and isinstance(lost[0], errors.CorruptRecordError)
        feed(reader, frame(b"later"), iter([1 << 30]))
        assert got == [b"ok"], "nothing is read after the connection ended"
    finally:
        loop.close()


def test_a_handshake_answer_past_its_bound_fails_the_handshake():
    loop = asyncio.new_event_loop()
    try:
        reader = AnswerReader(loop, buffer_size=64, max_frame=1 << 20, first_max=32)
        reader.connection_made(_Transport())
        feed(reader, frame(b"x" * 33), iter([1 << 30]))
        with pytest.raises(errors.CorruptRecordError):
            reader.first.result()
    finally:
        loop.close()


def test_frames_before_attach_are_handed_on_at_attach_and_a_loss_before_it_too():
    loop = asyncio.new_event_loop()
    try:
        reader = AnswerReader(loop, buffer_size=64, max_frame=1 << 20, first_max=32)
        reader.connection_made(_Transport())
        feed(reader, frame(b"handshake") + frame(b"early"), iter([1 << 30]))
        reader.connection_lost(None)
        got, lost = [], []
        reader.attach(lambda body: got.append(bytes(body)), lost.append)
        assert got == [b"early"]
        assert len(lost) == 1 and isinstance(lost[0], EOFError)
    finally:
        loop.close()


def test_the_gateway_closing_the_connection_is_reported_once():
    loop = asyncio.new_event_loop()
    try:
        reader, _, got, lost = make_reader(loop)
        feed(reader, frame(b"a") + b"\x00\x00", iter([1 << 30]))  # a frame, then half a prefix
        reader.eof_received()
        reader.connection_lost(None)
        reader.connection_lost(ConnectionResetError())
        assert got == [b"a"] and len(lost) == 1
    finally:
        loop.close()
