"""The fetch port's TLS link (``storage_node/fetch/links.py``) over a loopback TCP connection,
against the standard library's TLS client: who the handshake lets in, file slices sent through
TLS byte for byte, and a long poll's watch for a close that must neither miss a close nor lose a
request sent early."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl

import pytest

from services.tls import ClientTls, ReloadingSslContext, ServerTls, client_ssl_context
from storage_node.fetch.links import TLS_FILE_CHUNK, PlainLink, TlsLink
from tests.support.certificates import new_ca, new_certificate
from tests.support.wait import async_wait_until


def run_async(test):
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))

    return wrapper


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    ca = new_ca(directory, "cluster-ca")
    new_ca(directory, "client-ca")
    node = new_certificate(directory, "cluster-ca", "node")
    member = new_certificate(directory, "cluster-ca", "gateway")
    stranger = new_certificate(directory, "client-ca", "stranger")
    return {
        "server": ReloadingSslContext(ServerTls(*node, client_ca_file=ca)).context,
        "member": client_ssl_context(ClientTls(ca, *member)),
        "no certificate": client_ssl_context(ClientTls(ca)),
        "other CA": client_ssl_context(ClientTls(ca, *stranger)),
    }


async def _connect(server_context: ssl.SSLContext, client_context: ssl.SSLContext | None):
    """(server link, client reader, client writer, handshake task) over loopback TCP."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client_sock = socket.create_connection(listener.getsockname())
        server_sock, _ = listener.accept()
    server_sock.setblocking(False)
    link = TlsLink(loop, server_sock, server_context)
    handshake = asyncio.create_task(link.handshake())
    if client_context is None:
        reader, writer = await asyncio.open_connection(sock=client_sock)
    else:
        reader, writer = await asyncio.open_connection(
            sock=client_sock, ssl=client_context, server_hostname="127.0.0.1"
        )
    return link, reader, writer, handshake


@run_async
async def test_only_a_member_certificate_passes_the_handshake(pki):
    link, reader, writer, handshake = await _connect(pki["server"], pki["member"])
    await asyncio.wait_for(handshake, 5)
    assert link.peer_certificate is not None
    writer.close()
    link.close()
    for refused in ("no certificate", "other CA"):
        link, reader, writer, handshake = await _connect(pki["server"], pki[refused])
        with pytest.raises(ssl.SSLError):
            await asyncio.wait_for(handshake, 5)
        # TLS 1.3: the client learns of it at its first read.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.wait_for(reader.read(1), 5)
        writer.close()
        link.close()
    link, reader, writer, handshake = await _connect(pki["server"], None)  # plaintext
    writer.write(b"\x00\x00\x00\x10 not a TLS hello")
    with pytest.raises(ssl.SSLError):
        await asyncio.wait_for(handshake, 5)
    link.close()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer == b"" or answer[0] == 0x15  # nothing, or a TLS alert record
    writer.close()


@run_async
async def test_a_file_slice_goes_through_tls_byte_for_byte(pki, tmp_path):
    data = os.urandom(3 * TLS_FILE_CHUNK + 12345)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    link, reader, writer, handshake = await _connect(pki["server"], pki["member"])
    await asyncio.wait_for(handshake, 5)
    fd = os.open(path, os.O_RDONLY)
    try:
        await link.send_header(b"HEAD", more=True)
        send = asyncio.create_task(link.send_file(fd, 1000, len(data) - 2000))
        received = await asyncio.wait_for(reader.readexactly(4 + len(data) - 2000), 10)
        await send
        assert received == b"HEAD" + data[1000:-1000]
        with pytest.raises(OSError, match=r"ended .* early"):
            await link.send_file(fd, len(data) - 10, 20)
    finally:
        os.close(fd)
        writer.close()
        link.close()


@run_async
async def test_watching_for_a_close_sees_the_close_and_keeps_an_early_request(pki):
    link, _reader, writer, handshake = await _connect(pki["server"], pki["member"])
    await asyncio.wait_for(handshake, 5)
    closed = link.watch_for_close()
    writer.write(b"next request")  # sent while the server waits: must not count as a close
    await writer.drain()
    # The request arrives while the watch is on: read and kept, and the watch stops.
    await async_wait_until(lambda: link._ahead, timeout=5, what="the early request read")
    link.stop_watching()
    assert not closed.done()
    buffer = bytearray(64)
    got = await asyncio.wait_for(link.recv_into(memoryview(buffer)), 5)
    assert bytes(buffer[:got]) == b"next request"

    closed = link.watch_for_close()
    writer.close()
    await asyncio.wait_for(closed, 5)
    link.stop_watching()
    assert await link.recv_into(memoryview(buffer)) == 0
    link.close()


@run_async
async def test_try_send_takes_all_or_nothing_and_what_it_took_arrives_in_order(pki):
    link, reader, writer, handshake = await _connect(pki["server"], pki["member"])
    await asyncio.wait_for(handshake, 5)
    sent = []
    big = os.urandom(8 << 20)  # more than the socket buffers hold: part of it waits in the link
    assert link.try_send(big) == len(big)
    sent.append(big)
    assert link.try_send(b"later") == 0  # the rest of `big` goes first
    receiving = asyncio.create_task(reader.readexactly(len(big) + 5))
    await link.sendall(b"later")
    sent.append(b"later")
    await link.drain()
    assert await asyncio.wait_for(receiving, 10) == b"".join(sent)
    writer.close()
    link.close()


@run_async
async def test_plain_reads_kept_registered_get_every_byte_and_unregister_when_nobody_waits():
    """``recv_into_kept``: the socket stays registered between reads (no register/unregister
    per read), a read that times out loses nothing, a socket readable while nobody waits is
    unregistered, and close unregisters it (the loop keeps no closed descriptor)."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server_sock, _ = listener.accept()
    server_sock.setblocking(False)
    fd = server_sock.fileno()
    link = PlainLink(loop, server_sock)
    buffer = bytearray(16)
    view = memoryview(buffer)
    selector = loop._selector
    try:
        reading = asyncio.ensure_future(link.recv_into_kept(view, loop.time() + 30))
        await asyncio.sleep(0)
        client.sendall(b"one")
        assert await asyncio.wait_for(reading, 5) == 3 and bytes(buffer[:3]) == b"one"
        assert fd in selector.get_map()  # still registered after the read
        with pytest.raises(TimeoutError):
            await link.recv_into_kept(view, loop.time() + 0.05)  # its deadline
        client.sendall(b"two")  # readable, nobody waiting: unregistered, nothing read
        await async_wait_until(lambda: fd not in selector.get_map(), timeout=5)
        assert (
            await asyncio.wait_for(link.recv_into_kept(view, loop.time() + 30), 5) == 3
            and bytes(buffer[:3]) == b"two"
        )
        assert fd in selector.get_map()
        client.close()
        assert await asyncio.wait_for(link.recv_into_kept(view, loop.time() + 30), 5) == 0  # the peer closed
    finally:
        link.close()
    assert fd not in selector.get_map()


@run_async
async def test_plain_kept_reads_offer_bytes_to_take_and_wait_on_past_the_deadline_it_sets():
    """``recv_into_kept(take=...)``: bytes ``take`` keeps do not end the wait, which goes on into
    the view it returns and by the deadline it returns (later than the wait's own); bytes it
    leaves end the wait with their count; a ``take`` that raises ends the wait with its error;
    and a wait whose bytes were all taken still times out at the last deadline set."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server_sock, _ = listener.accept()
    server_sock.setblocking(False)
    link = PlainLink(loop, server_sock)
    buffer = bytearray(16)
    view = memoryview(buffer)
    taken: list[bytes] = []

    def take(count: int):
        data = bytes(buffer[:count])
        if data.startswith(b"leave"):
            return None
        if data.startswith(b"raise"):
            raise ValueError("the reader's bug")
        taken.append(data)
        return view, loop.time() + 0.4

    try:
        reading = asyncio.ensure_future(link.recv_into_kept(view, loop.time() + 0.2, take))
        for word in (b"one", b"two", b"three"):  # each arrives on its own, all taken
            await asyncio.sleep(0.1)
            client.sendall(word)
            await async_wait_until(lambda word=word: taken and taken[-1] == word, timeout=5)
        assert not reading.done()  # past the wait's own deadline: put off by what was taken
        client.sendall(b"leave")
        assert await asyncio.wait_for(reading, 5) == 5 and bytes(buffer[:5]) == b"leave"
        assert taken == [b"one", b"two", b"three"]
        failing = asyncio.ensure_future(link.recv_into_kept(view, loop.time() + 30, take))
        await asyncio.sleep(0)
        client.sendall(b"raise")
        with pytest.raises(ValueError):
            await asyncio.wait_for(failing, 5)
        started = loop.time()
        quiet = asyncio.ensure_future(link.recv_into_kept(view, loop.time() + 0.2, take))
        await asyncio.sleep(0.1)
        client.sendall(b"four")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(quiet, 5)
        assert taken[-1] == b"four"
        assert loop.time() - started >= 0.1 + 0.4 - 0.05  # the deadline "four" set, not the first
    finally:
        client.close()
        link.close()
