"""How a fetch-port long poll waits: woken by an append in one loop turn, by its client's
close, or at its timeout (a stand-in link; the notifier and the server's wait are the real ones)."""

from __future__ import annotations

import asyncio

import pytest

from storage_node.fetch import server as fetch_server
from storage_node.notifier import AppendNotifier

KEYS = [("t", p) for p in range(3)]


class StandInLink:
    """The part of a link a long poll uses: a close it can be told of."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[None] | None = None
        self.watching = False

    def watch_for_close(self) -> asyncio.Future[None]:
        self.closed = asyncio.get_running_loop().create_future()
        self.watching = True
        return self.closed

    def stop_watching(self) -> None:
        self.watching = False


def _server(notifier: AppendNotifier) -> fetch_server.FetchServer:
    return fetch_server.FetchServer(reader=None, notifier=notifier)  # type: ignore[arg-type]


def test_an_append_wakes_the_poll_in_one_loop_turn():
    async def scenario():
        notifier = AppendNotifier()
        link = StandInLink()
        poll = asyncio.ensure_future(
            _server(notifier)._wait_for_appends(fetch_server._Connection(link, "h"), KEYS, 30.0)
        )
        await asyncio.sleep(0)  # the poll is waiting
        assert not poll.done() and link.watching
        notifier.notify(KEYS[2])
        await asyncio.sleep(0)  # one turn: the poll has run on and returned
        assert poll.done() and poll.result() is None
        assert not link.watching and notifier.watched() == 0

    asyncio.run(scenario())


def test_the_poll_ends_at_its_timeout_or_at_its_clients_close():
    async def scenario():
        notifier = AppendNotifier()
        server = _server(notifier)
        link = StandInLink()
        conn = fetch_server._Connection(link, "h")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server._wait_for_appends(conn, KEYS, 0.05)
        assert loop.time() - started >= 0.04 and notifier.watched() == 0

        poll = asyncio.ensure_future(server._wait_for_appends(conn, KEYS, 30.0))
        await asyncio.sleep(0)
        assert link.closed is not None
        link.closed.set_result(None)
        with pytest.raises(fetch_server._PeerClosed):
            await asyncio.wait_for(poll, 5)
        assert server.stats.polls_cancelled == 1 and notifier.watched() == 0

    asyncio.run(scenario())
