"""A fetch-port connection's byte stream, plaintext or TLS, behind one interface.

The fetch server and the append connections (``server.py``, ``appends.py``) read requests and
write answers and segment-file slices through a *link*:

* :class:`PlainLink` is the socket itself: the event loop's ``sock_*`` calls, and file slices
  with ``os.sendfile`` straight from the page cache (zero-copy), the header corked in front of
  them (``MSG_MORE``). This is the path of a cluster without internal TLS, unchanged.
* :class:`TlsLink` runs TLS in the process with an :class:`ssl.SSLObject` over two memory BIOs,
  the raw socket still driven by the event loop's ``sock_*`` calls. ``sendfile`` cannot send
  through user-space TLS (the kernel would send the file's plaintext), so a slice is read from
  the file in :data:`TLS_FILE_CHUNK` pieces into one reused buffer, encrypted, and sent: the
  records pass through the process (counted as copied bytes). Kernel TLS would keep sendfile,
  but needs ``ssl.OP_ENABLE_KTLS`` (Python 3.12+) and a kernel with the ``tls`` module.

What a link promises its users: ``recv_into`` returns 0 once the peer closed (for TLS also an
unclean close: a truncated stream ends the connection like a reset); ``try_send`` never blocks
and takes all of ``data`` or none of it for TLS (ciphertext the socket did not take goes out from
a task of the link's own, before anything sent later; while it does, ``try_send`` takes nothing,
so the caller's own queue keeps its back-pressure); sends are not concurrent (one request at a time on a
fetch connection, one sender on an append connection). Reading never sends: TLS messages a read
produces (a key update's answer) leave with the next answer.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
from collections.abc import Callable
from typing import cast

#: Bytes of a file slice read, encrypted and sent at a time under TLS (16 TLS records).
TLS_FILE_CHUNK = 256 << 10
#: Raw bytes received from the socket at a time under TLS.
_TLS_RECV_BYTES = 64 << 10
#: Plaintext read ahead while watching for a close (a request sent early), at most.
_READ_AHEAD_BYTES = 64 << 10

#: ``take(count)``, for :meth:`PlainLink.recv_into_kept`: the reader's use of ``count`` bytes
#: just received into the wait's view, in the callback that received them. None: the wait ends
#: with them (the reader takes them when it resumes); else the wait goes on -- the reader has
#: used them -- with the next bytes received into this view, by this deadline (loop time).
Take = Callable[[int], "tuple[memoryview, float] | None"]


class PlainLink:
    """The socket as it is (see the module docstring)."""

    __slots__ = ("_deadline", "_reader", "_timer", "_waiting", "loop", "sock", "zero_copy")

    tls = False

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, *, zero_copy: bool = True
    ) -> None:
        self.loop = loop
        self.sock = sock
        #: File slices go with os.sendfile; False: read + send (the comparison benchmarks).
        self.zero_copy = zero_copy
        #: Whether the event loop watches the socket for :meth:`recv_into_kept`.
        self._reader = False
        #: The read :meth:`recv_into_kept` waits for: its future, where the bytes go, and who
        #: may take them at once (``Take``).
        self._waiting: tuple[asyncio.Future[int], memoryview, Take | None] | None = None
        #: The wait's deadline (loop time; put off by what ``take`` takes) and its timer.
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    async def handshake(self) -> None:
        """Nothing to agree on in plaintext."""

    def recv_into_nowait(self, view: memoryview) -> int:
        """Bytes received into ``view`` if some are waiting (0: closed); else BlockingIOError."""
        return self.sock.recv_into(view)

    async def recv_into(self, view: memoryview) -> int:
        return await self.loop.sock_recv_into(self.sock, view)

    async def recv_into_kept(self, view: memoryview, deadline: float, take: Take | None = None) -> int:
        """:meth:`recv_into` for a connection read again and again (an append connection):
        the socket stays registered with the event loop between reads, and the read is not
        tried first (the caller's ``recv_into_nowait`` just found nothing). ``sock_recv_into``
        tried a recv and registered, then unregistered, the socket for every wait: three
        system calls a request of a one-at-a-time producer. The socket is unregistered when it
        is readable while nobody waits (a level-triggered poll would wake the loop for it
        again and again), and by :meth:`close`. Raises TimeoutError at ``deadline`` (loop
        time), from a timer on the read's future (``asyncio.timeout_at`` cost as much again).

        ``take`` (see ``Take``) is offered the bytes in the callback that received them: what
        it takes costs the reader no wake-up (no task step, no turn of the loop), and the wait
        goes on; the count returned is that of the bytes it left."""
        loop = self.loop
        future: asyncio.Future[int] = loop.create_future()
        self._waiting = (future, view, take)
        self._deadline = deadline
        if not self._reader:
            loop.add_reader(self.sock.fileno(), self._readable)
            self._reader = True
        self._timer = loop.call_at(deadline, self._wait_expired, future)
        try:
            return await future
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiting = None

    def _wait_expired(self, future: asyncio.Future[int]) -> None:
        """The wait's timer: TimeoutError, unless ``take`` put the deadline off meanwhile (then
        the timer is armed again for it: one timer a wait, not one per bytes taken)."""
        self._timer = None
        if future.done():
            return
        if self._deadline > self.loop.time():
            self._timer = self.loop.call_at(self._deadline, self._wait_expired, future)
            return
        future.set_exception(TimeoutError())

    def _readable(self) -> None:
        waiting = self._waiting
        if waiting is None or waiting[0].done():
            self._unregister()
            return
        future, view, take = waiting
        try:
            got = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return  # woken for nothing: still waiting
        except OSError as exc:
            self._waiting = None
            future.set_exception(exc)
            return
        if got and take is not None:
            try:
                taken = take(got)
            except Exception as exc:  # noqa: BLE001 -- a bug in the reader: its wait ends with it
                self._waiting = None
                future.set_exception(exc)
                return
            if taken is not None:
                view, self._deadline = taken
                self._waiting = (future, view, take)
                return
        self._waiting = None
        future.set_result(got)

    def _unregister(self) -> None:
        if self._reader:
            self._reader = False
            self.loop.remove_reader(self.sock.fileno())

    def try_send(self, data: bytes) -> int:
        """Send what the socket takes now, without waiting; returns how much of ``data``."""
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return 0

    async def sendall(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def drain(self) -> None:
        """Wait until what ``try_send`` took has left (it has: it took only what the socket did)."""

    async def send_header(self, header: bytes, *, more: bool) -> None:
        """Send a response header; with ``more``, corked (MSG_MORE) so it leaves in the same TCP
        segment as the records that follow instead of as its own packet and wake-up (measured: a
        separate ~40-byte send cost ~200 us of loopback stack time per fetch)."""
        if more:
            try:
                sent = self.sock.send(header, socket.MSG_MORE)
            except BlockingIOError:
                sent = 0
            header = header[sent:]
        if header:
            await self.loop.sock_sendall(self.sock, header)

    async def send_file(self, file_fd: int, position: int, length: int) -> None:
        """``length`` bytes of ``file_fd`` from ``position``: sendfile, or read + send."""
        send = sendfile_range if self.zero_copy else copy_range
        await send(self.loop, self.sock, file_fd, position, length)

    def watch_for_close(self) -> asyncio.Future[None]:
        """A future done when the peer closes the connection (EOF or reset), for a long poll to
        wait on; call :meth:`stop_watching` after. The socket is only peeked at: if the client
        sends its next request early, watching stops and the request stays unread."""
        closed: asyncio.Future[None] = self.loop.create_future()
        sock = self.sock

        def on_readable() -> None:
            try:
                peeked = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                return
            except OSError:  # reset by the peer
                peeked = b""
            self.stop_watching()
            if not peeked and not closed.done():
                closed.set_result(None)

        self._reader = False  # replaced by on_readable
        self.loop.add_reader(sock.fileno(), on_readable)
        return closed

    def stop_watching(self) -> None:
        self.loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._unregister()
        self.sock.close()


class TlsLink:
    """TLS as the server side, in the process (see the module docstring). Call
    :meth:`handshake` first; it raises :class:`ssl.SSLError` when the client is refused (no
    certificate, one the CA did not sign, not TLS at all) and ConnectionError when it left."""

    tls = True
    zero_copy = False

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.loop = loop
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._raw = bytearray(_TLS_RECV_BYTES)
        self._raw_view = memoryview(self._raw)
        #: Sends the ciphertext a ``try_send`` left over (the socket did not take it all).
        self._draining: asyncio.Task[None] | None = None
        #: Plaintext already decrypted while watching for a close (a request sent early).
        self._ahead = bytearray()
        self._peer_closed = False
        self._file_buffer: bytearray | None = None

    @property
    def peer_certificate(self) -> dict | None:
        """The client's certificate as :meth:`ssl.SSLSocket.getpeercert` gives it (after the
        handshake; None without one)."""
        return self._tls.getpeercert() or None

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._send_outgoing()
                if not await self._receive():
                    raise ConnectionResetError(
                        "the client closed the connection during the TLS handshake"
                    ) from None
            except ssl.SSLError:
                self._send_outgoing_nowait()  # the alert, so the client learns why
                raise
        await self._send_outgoing()  # the handshake's last flight (and TLS 1.3 session tickets)

    # ---- reading ---------------------------------------------------------------------------------

    async def recv_into(self, view: memoryview) -> int:
        while True:
            if self._ahead:
                return self._take_ahead(view)
            try:
                return cast(int, self._tls.read(len(view), view))
            except ssl.SSLWantReadError:
                if not await self._receive():
                    return 0
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0

    async def recv_into_kept(self, view: memoryview, deadline: float, take: Take | None = None) -> int:
        """:meth:`recv_into` by ``deadline`` (loop time; TimeoutError then). The socket is
        registered per wait under TLS, and ``take`` is not offered anything (the reader takes
        every byte when it resumes)."""
        async with asyncio.timeout_at(deadline):
            return await self.recv_into(view)

    def recv_into_nowait(self, view: memoryview) -> int:
        if self._ahead:
            return self._take_ahead(view)
        for _ in range(2):
            try:
                return cast(int, self._tls.read(len(view), view))
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return 0
            if not self._receive_nowait():  # BlockingIOError when nothing waits
                return 0
        raise BlockingIOError(errno.EAGAIN, "a TLS record is not complete yet")

    def _take_ahead(self, view: memoryview) -> int:
        count = min(len(view), len(self._ahead))
        view[:count] = self._ahead[:count]
        del self._ahead[:count]
        return count

    async def _receive(self) -> bool:
        """Raw bytes from the socket into the TLS engine; False once the peer closed."""
        if self._peer_closed:
            return False
        count = await self.loop.sock_recv_into(self.sock, self._raw_view)
        return self._feed(count)

    def _receive_nowait(self) -> bool:
        if self._peer_closed:
            return False
        return self._feed(self.sock.recv_into(self._raw_view))

    def _feed(self, count: int) -> bool:
        if count == 0:
            self._peer_closed = True
            self._incoming.write_eof()
            return False
        self._incoming.write(self._raw_view[:count])
        return True

    def watch_for_close(self) -> asyncio.Future[None]:
        """As :meth:`PlainLink.watch_for_close`; a request that arrives early is decrypted and
        kept (``recv_into`` returns it first)."""
        closed: asyncio.Future[None] = self.loop.create_future()
        if self._ahead:
            return closed  # a request is waiting already: nothing to watch for
        if self._peer_closed:
            closed.set_result(None)
            return closed

        def on_readable() -> None:
            try:
                if self._receive_nowait():
                    self._ahead += self._tls.read(_READ_AHEAD_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError):
                return  # nothing yet, or only part of a record: keep watching
            except (OSError, ssl.SSLError):  # a reset, close_notify, a broken record
                self._peer_closed = True
            self.stop_watching()
            if (self._peer_closed or not self._ahead) and not closed.done():
                closed.set_result(None)

        self.loop.add_reader(self.sock.fileno(), on_readable)
        return closed

    def stop_watching(self) -> None:
        self.loop.remove_reader(self.sock.fileno())

    # ---- writing ---------------------------------------------------------------------------------

    def try_send(self, data: bytes) -> int:
        if self._draining is not None or self._outgoing.pending:
            return 0
        self._tls.write(data)
        ciphertext = self._outgoing.read()
        try:
            sent = self.sock.send(ciphertext)
        except BlockingIOError:
            sent = 0
        if sent < len(ciphertext):
            # Encrypted already, so it must go out in this order: a task of its own sends the
            # rest (every later send waits for it), and a failure surfaces at the next send.
            self._draining = self.loop.create_task(self.loop.sock_sendall(self.sock, ciphertext[sent:]))
        return len(data)

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), TLS_FILE_CHUNK):
            self._tls.write(view[start : start + TLS_FILE_CHUNK])
            await self._send_outgoing()
        if not view:
            await self._send_outgoing()

    async def drain(self) -> None:
        """Wait until what ``try_send`` took has left."""
        await self._send_outgoing()

    async def send_header(self, header: bytes, *, more: bool) -> None:
        """Encrypt the header; with ``more`` it waits to leave with the records' first piece."""
        self._tls.write(header)
        if not more:
            await self._send_outgoing()

    async def send_file(self, file_fd: int, position: int, length: int) -> None:
        """Read, encrypt and send ``length`` bytes of ``file_fd`` from ``position``. Fails loudly
        (OSError) if the file ends early, as :func:`sendfile_range` does."""
        if self._file_buffer is None:
            self._file_buffer = bytearray(TLS_FILE_CHUNK)
        buffer = memoryview(self._file_buffer)
        done = 0
        while done < length:
            want = min(len(buffer), length - done)
            got = os.preadv(file_fd, [buffer[:want]], position + done)
            if got == 0:
                raise OSError(
                    errno.EIO, f"segment file ended {length - done} bytes early while serving a fetch"
                )
            self._tls.write(buffer[:got])
            await self._send_outgoing()
            done += got

    async def _send_outgoing(self) -> None:
        if self._draining is not None:
            draining, self._draining = self._draining, None
            await draining
        if self._outgoing.pending:
            await self.loop.sock_sendall(self.sock, self._outgoing.read())

    def _send_outgoing_nowait(self) -> None:
        try:
            if self._outgoing.pending and self._draining is None:
                self.sock.send(self._outgoing.read())
        except OSError:
            pass

    def close(self) -> None:
        """Say goodbye (close_notify) if the socket takes it at once, and close."""
        if self._draining is not None:
            self._draining.cancel()
            self._draining.add_done_callback(_retrieve)
            self._draining = None
        if not self._peer_closed:
            try:
                self._tls.unwrap()
            except ssl.SSLError:
                pass  # the peer's close_notify has not come: ours is written all the same
            self._send_outgoing_nowait()
        self.sock.close()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # the connection is closing: its send failure is of no interest


# ---- the plaintext file paths ------------------------------------------------------------------


async def _wait_writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    future = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, lambda: None if future.done() else future.set_result(None))
    try:
        await future
    finally:
        loop.remove_writer(fd)


async def sendfile_range(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, file_fd: int, position: int, length: int
) -> None:
    """Send ``length`` bytes of ``file_fd`` from ``position`` with ``os.sendfile``.

    Fails loudly (OSError) if the file ends before ``length`` bytes: a segment must never shrink
    under a reader, and a short send would corrupt the framing.
    """
    sent_total = 0
    out_fd = sock.fileno()
    while sent_total < length:
        try:
            sent = os.sendfile(out_fd, file_fd, position + sent_total, length - sent_total)
        except BlockingIOError:
            await _wait_writable(loop, sock)
            continue
        if sent == 0:
            raise OSError(
                errno.EIO, f"segment file ended {length - sent_total} bytes early while serving a fetch"
            )
        sent_total += sent


async def copy_range(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, file_fd: int, position: int, length: int
) -> None:
    """The non-zero-copy comparison path: pread into the process, then send (benchmarks only)."""
    chunk = 1 << 20
    done = 0
    while done < length:
        data = os.pread(file_fd, min(chunk, length - done), position + done)
        if not data:
            raise OSError(errno.EIO, "segment file ended early while serving a fetch")
        await loop.sock_sendall(sock, data)
        done += len(data)
