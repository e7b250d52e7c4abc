"""Helpers for the etcd integration tests: running coroutines, polling, and a cuttable TCP link."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from services.etcd import Watch

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run one test scenario in a fresh event loop, failing it if it hangs."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def take(watch: Watch, count: int, timeout: float = 5.0) -> list[Any]:
    """The next ``count`` items of ``watch``."""
    items: list[Any] = []
    async with asyncio.timeout(timeout):
        while len(items) < count:
            items.append(await anext(watch))
    return items


async def assert_nothing_more(watch: Watch, wait: float = 0.3) -> None:
    """Fail if ``watch`` yields anything within ``wait`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait):
            item = await anext(watch)
            raise AssertionError(f"unexpected extra watch item {item!r}")


class TcpLink:
    """A loopback TCP forwarder to ``target`` that a test can cut and restore.

    :meth:`cut` closes the listening socket (new connections are refused) and aborts every open
    connection, as a network partition between one client and etcd would; :meth:`restore`
    listens again on the same port. Other clients talking to etcd directly are unaffected.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> TcpLink:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        await self.start()

    async def close(self) -> None:
        await self.cut()

    async def __aenter__(self) -> TcpLink:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, server_writer))
        await asyncio.gather(
            self._pump(client_reader, server_writer),
            self._pump(server_reader, client_writer),
            return_exceptions=True,
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
