"""Reading the gateway's answer frames on a raw data connection, in the socket's own callback.

A data connection (``gateway/client/dataport.py``) used to read its answers with a task over a
``StreamReader``: the bytes were received into a fresh bytes object, appended to the reader's
buffer, sliced out (two copies more) and the buffer's front deleted, and the task that awaited
them ran a turn of the event loop after they arrived. :class:`AnswerReader` is the connection's
asyncio protocol instead (a ``BufferedProtocol``): the socket receives straight into its buffer,
and each whole frame is handed on (``on_frame``) in the callback that completed it.

* Frames that fit the read buffer (every produce answer, small fetch answers) are cut from it
  with one copy each (the buffer is reused for the next read).
* A larger frame (a fetch answer of hundreds of KB) gets a buffer of its exact size, which the
  socket then fills directly: what arrived of it with its header is copied once, the rest not
  at all, and the frame is handed on as a memoryview of it (nothing else ever writes to it).
* A frame whose length prefix is 0 or above ``max_frame`` ends the connection (``on_lost``
  with a CorruptRecordError): the client never allocates what a confused or hostile peer
  names.

Writing keeps asyncio's flow control (``FlowControlMixin``: ``StreamWriter.drain`` waits while
the transport is paused). The first frame -- the handshake answer, read before the connection
has a reader of frames -- resolves :attr:`AnswerReader.first`; its bound is ``first_max``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from services import errors

_SIZE = struct.Struct(">I")


class AnswerReader(asyncio.streams.FlowControlMixin, asyncio.BufferedProtocol):
    """The protocol of one data connection: cuts length-prefixed frames (see module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        buffer_size: int,
        max_frame: int,
        first_max: int,
    ) -> None:
        super().__init__(loop)
        self.transport: asyncio.Transport | None = None
        #: The handshake answer's body (or why it did not come).
        self.first: asyncio.Future[bytes] = loop.create_future()
        #: Handed every later frame's body, in order (:meth:`attach`).
        self.on_frame: Callable[[bytes | memoryview], None] | None = None
        #: Told once why the connection ended (:meth:`attach`).
        self.on_lost: Callable[[BaseException], None] | None = None
        self._max_frame = max_frame
        self._first_max = first_max
        self._buffer = bytearray(buffer_size)
        self._view = memoryview(self._buffer)
        #: The unread bytes are ``_buffer[_start:_end]``.
        self._start = 0
        self._end = 0
        #: A frame larger than the buffer, being received into a buffer of its own.
        self._large: bytearray | None = None
        self._large_view: memoryview | None = None
        self._large_got = 0
        self._closed = loop.create_future()
        #: Frames after the first that came before :meth:`attach`.
        self._early: list[bytes | memoryview] = []
        self._done = False
        #: Why the connection ended (once it has).
        self._lost: BaseException | None = None

    # -- asyncio's protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large_view is not None:
            return self._large_view[self._large_got :]
        if self._end == len(self._buffer):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_got += nbytes
            if self._large_got == len(self._large):
                body = self._large_view
                assert body is not None
                self._large = self._large_view = None
                self._large_got = 0
                self._hand_on(body)
            return
        self._end += nbytes
        self._cut_frames()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # wakes whoever waits in drain()
        if not self._closed.done():
            self._closed.set_result(None)
        self._end_with(exc if exc is not None else EOFError("closed by the gateway"))

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future:
        # StreamWriter.wait_closed() asks its protocol for this.
        return self._closed

    # -- frames -------------------------------------------------------------------------------

    def _cut_frames(self) -> None:
        buffer, start, end = self._buffer, self._start, self._end
        while end - start >= _SIZE.size and not self._done:
            (size,) = _SIZE.unpack_from(buffer, start)
            limit = self._first_max if not self.first.done() else self._max_frame
            if not 0 < size <= limit:
                self._fail(errors.CorruptRecordError(f"answer frame size {size} outside 1..{limit}"))
                return
            frame_end = start + _SIZE.size + size
            if frame_end <= end:
                body = bytes(self._view[start + _SIZE.size : frame_end])
                start = self._start = frame_end
                self._hand_on(body)
                continue
            if _SIZE.size + size > len(buffer):
                # Too large for the buffer: receive the rest straight into a buffer of its own.
                large = bytearray(size)
                got = end - start - _SIZE.size
                large[:got] = self._view[start + _SIZE.size : end]
                self._large, self._large_view, self._large_got = large, memoryview(large), got
                start = end
            break
        self._start = start
        if start == self._end:
            self._start = self._end = 0
        elif start:
            self._compact()  # the start of a frame: room for its rest

    def _compact(self) -> None:
        """Move the unread bytes to the front of the buffer (room for the rest of a frame)."""
        start, end = self._start, self._end
        if start:
            self._buffer[: end - start] = self._view[start:end]
            self._start, self._end = 0, end - start

    def _hand_on(self, body: bytes | memoryview) -> None:
        if self._done:
            return
        if not self.first.done():
            self.first.set_result(bytes(body))
            return
        if self.on_frame is None:
            self._early.append(body)  # before the connection took over: handed on by attach()
            return
        self.on_frame(body)

    def attach(
        self, on_frame: Callable[[bytes | memoryview], None], on_lost: Callable[[BaseException], None]
    ) -> None:
        """Hand every frame after the first to ``on_frame`` and the connection's end to
        ``on_lost`` (at once, if it already ended)."""
        self.on_frame, self.on_lost = on_frame, on_lost
        early, self._early = self._early, []
        for body in early:
            on_frame(body)
        if self._done and self._lost is not None:
            on_lost(self._lost)

    def _fail(self, error: BaseException) -> None:
        """End the connection for ``error`` (an unreadable frame)."""
        self._end_with(error)
        if self.transport is not None:
            self.transport.abort()

    def _end_with(self, error: BaseException) -> None:
        if self._done:
            return
        self._done = True
        self._lost = error
        if not self.first.done():
            self.first.set_exception(error)
        elif self.on_lost is not None:
            self.on_lost(error)
