"""A fetch session's next read, sent to the storage node as soon as its last answer is written.

Between a session's answer and its next fetch, no long poll of the consumer waits at the storage
node: the answer goes gateway -> SDK, and the SDK's next fetch SDK -> gateway -> node. A record
appended meanwhile waited for that fetch to arrive. Timestamped per hop at 2,000 records/s (one
partition, acks=1, linger 0, a 500 ms long poll; 2026-11-25), a fetch was waiting at the node for
only ~8% of the time and 95% of the records were appended while none was, then waited ~1 ms for
the next one.

So once a session's answer is written, the gateway starts the read that the session's next
incremental fetch would make -- its partitions at their new positions, with the answered
request's ``min_bytes``, ``max_wait_ms``, ``max_bytes`` and isolation level (:meth:`ReadAhead.start`).
When the next fetch arrives and asks for exactly that (the consumer moved no partition, as it
does not while it reads on), it is served by that read (:meth:`ReadAhead.fetch_news`): at once
when the read is done, else when it is. A fetch that asks for anything else cancels the read and
reads afresh, and so does one arriving after a read that ended on its wait without news to
answer (the read's own wait began earlier than the fetch's; answering earlier than
``max_wait_ms`` is within a long poll's contract, so a read still waiting when its fetch arrives
is used whatever it brings).

A read ahead has no effect of its own: a session's positions move only when an answer is written
(``FetchSessions.complete``), so a dropped read loses nothing; records read ahead reach the
client only in the answer to a fetch that asked for them, after that fetch's authorization.

Bounds: one read ahead per connection (the last answered session's), holding at most the
``max_bytes`` of the fetch it was started for; it ends with its wait (``max_wait_ms``) and is
cancelled with its connection. Only long polls (``min_bytes`` and ``max_wait_ms`` above 0) of
clients without quotas, while telemetry is off, are read ahead (a read that may be dropped would
make spans and count bytes out for nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

from gateway.server.fetch import FetchCommand, FetchedPartition, NewsRead
from gateway.server.fetch_sessions import FetchSession
from services import errors


class NewsReader(Protocol):
    """What reads for a read ahead (``FetchHandler``)."""

    async def read_news(self, command: FetchCommand) -> NewsRead: ...

    async def fetch_news(self, command: FetchCommand) -> list[FetchedPartition | None]: ...


class ReadAhead:
    """One connection's read ahead (see the module docstring)."""

    __slots__ = ("_command", "_done_at", "_read", "_session", "dropped", "started", "used")

    def __init__(self) -> None:
        self._read: asyncio.Task[NewsRead] | None = None
        #: The session and the command the read was started for.
        self._session: FetchSession | None = None
        self._command: FetchCommand | None = None
        #: Event-loop time the read ended at (while it runs: None).
        self._done_at: float | None = None
        #: Reads started, used by the fetch they were started for, and dropped (for tests).
        self.started = 0
        self.used = 0
        self.dropped = 0

    @staticmethod
    def wanted(command: FetchCommand) -> bool:
        """Whether a fetch like ``command`` is worth reading ahead: a long poll."""
        return command.min_bytes > 0 and command.max_wait_ms > 0

    def start(
        self, handler: NewsReader, session: FetchSession, command: FetchCommand, tasks: set[asyncio.Task]
    ) -> None:
        """Start reading what ``session``'s next fetch, asking ``command``, would read; its task
        is kept in ``tasks`` while it runs (the connection's: cancelled when it ends). Not while
        a read of another session of the connection runs (several sessions on one connection
        take turns at it rather than cancel each other's; a closed session's read gives way)."""
        read, holder = self._read, self._session
        if read is not None:
            if holder is not session and holder is not None and not holder.closed and not read.done():
                return
            self.cancel()
        self._session, self._command, self._done_at = session, command, None
        self._read = read = asyncio.ensure_future(handler.read_news(command))
        tasks.add(read)
        read.add_done_callback(tasks.discard)
        read.add_done_callback(self._ended)
        self.started += 1

    def _ended(self, read: asyncio.Task[NewsRead]) -> None:
        if read is self._read:
            self._done_at = asyncio.get_running_loop().time()
        if not read.cancelled():
            read.exception()  # retrieved: a dropped read's error is nobody's (a used one's is raised)

    def cancel(self) -> None:
        """Drop the read in flight or done, if any."""
        read, self._read = self._read, None
        self._session, self._command = None, None
        if read is not None:
            read.cancel()
            self.dropped += 1

    async def fetch_news(
        self, handler: NewsReader, session: FetchSession | None, command: FetchCommand
    ) -> list[FetchedPartition | None]:
        """``handler.fetch_news(command)`` for an incremental fetch of ``session``, served by the
        read ahead when it was started for this session and command and either is still
        waiting (its wait ends first) or ended with news to answer within the last
        ``max_wait_ms``; otherwise by a fresh read."""
        read = self._read
        if read is None or self._session is not session:
            return await handler.fetch_news(command)
        if self._command != command:
            self.cancel()  # the client moved on (a seek, a pause, another partition)
            return await handler.fetch_news(command)
        done_at = self._done_at
        self._read, self._session, self._command = None, None, None
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        try:
            news: NewsRead | None = await read  # (a cancelled fetch cancels the read with it)
        except errors.TributaryError:
            news = None
        if news is not None and (
            done_at is None or (news.satisfied and arrived - done_at <= command.max_wait_ms / 1000.0)
        ):
            self.used += 1
            return news.results
        self.dropped += 1
        left_ms = command.max_wait_ms - int((loop.time() - arrived) * 1000)
        if left_ms != command.max_wait_ms:
            command = dataclasses.replace(command, max_wait_ms=max(0, left_ms))
        return await handler.fetch_news(command)
