"""Fetch sessions (KIP-227) of one raw data connection: pure bookkeeping, no I/O.

A session remembers the partitions a consumer fetches and the position of each, so that after
one full fetch the consumer names only what changed and gets back only the partitions that have
something to say (the frames are in ``services/dataport/protocol.py``, "Fetch sessions"). This
module decides, for one request, which session it belongs to (or refuses it with Kafka's
FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH), which partitions to fetch and at which
offsets, and afterwards which results to answer and where each position moves.

Bounds, so a client cannot grow the gateway's memory: a connection holds at most
``max_sessions`` sessions (opening one more evicts the least recently used one) and a session at
most ``max_partitions`` partitions (a full fetch over that is served without a session; an
incremental one that would grow past it closes the session). Sessions live in their
connection's :class:`FetchSessions` and die with it.

One fetch at a time per session: the listener serves requests concurrently, and a second
incremental fetch read while the first is still being served would fetch from positions the
first is about to move. It is refused (INVALID_FETCH_SESSION_EPOCH); the SDK never sends one.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from services import errors
from services.dataport import protocol as dp

if TYPE_CHECKING:
    from gateway.server.fetch import PartitionFetch

#: Sessions one connection may hold (a consumer needs one; a few leave room for several
#: fetchers sharing a connection).
DEFAULT_MAX_SESSIONS = 4
#: Partitions one session may hold (the 20,000-partition scale test fits).
DEFAULT_MAX_PARTITIONS = 25_000


@dataclass(slots=True)
class SessionPartition:
    """One partition of a session: where its next fetch starts, and what was last answered."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    #: Last answered high watermark, last stable offset and log start offset; -1 = never
    #: answered (the next answer carries the partition whatever it holds).
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: What the gateway's fetch reads for the partition (made from the fields above), kept
    #: while they hold: a wide session's every fetch, and the read ahead after it, pass every
    #: partition on (``data_listener._partition_fetches``). Every change of the fields above
    #: goes through ``moved`` or ``forget_answers``, which drop it.
    fetch: PartitionFetch | None = field(default=None, compare=False, repr=False)

    def forget_answers(self) -> None:
        self.high_watermark = self.last_stable_offset = self.log_start_offset = -1
        self.fetch = None

    def moved(self, offset: int, high_watermark: int, last_stable_offset: int, log_start_offset: int) -> None:
        """An answer moved the partition to ``offset`` and told these offsets."""
        self.offset = offset
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.fetch = None


@dataclass(slots=True)
class FetchSession:
    id: int
    #: The epoch the next incremental fetch must carry.
    epoch: int = 1
    #: By (topic, partition), in fetch order (rotated: see ``FetchSessions.complete``).
    partitions: dict[tuple[str, int], SessionPartition] = field(default_factory=dict)
    #: A fetch of the session is being served.
    busy: bool = False
    #: Closed (replaced, evicted, failed, its connection gone): a fetch in flight must not
    #: touch it any more.
    closed: bool = False


@dataclass(frozen=True, slots=True)
class SessionFetch:
    """What one request fetches: its partitions in fetch order, and the session it runs in."""

    #: None: a fetch without a session (version 2, sessionless, or refused a session).
    session: FetchSession | None
    #: A full fetch (its answer carries every partition), else incremental.
    full: bool
    partitions: tuple[SessionPartition, ...]

    @property
    def session_id(self) -> int:
        return self.session.id if self.session is not None else dp.NO_SESSION_ID


class Answered(Protocol):
    """What the result of a partition says, as ``complete`` reads it (a ``FetchedPartition``)."""

    @property
    def error(self) -> errors.TributaryError | None: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...


@dataclass(slots=True)
class SessionCounts:
    """What happened to sessions (for telemetry and tests)."""

    opened: int = 0
    evicted: int = 0
    refused: int = 0
    full_fetches: int = 0
    incremental_fetches: int = 0


class FetchSessions:
    """The fetch sessions of one connection."""

    def __init__(
        self,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        counts: SessionCounts | None = None,
    ) -> None:
        if max_sessions < 0 or max_partitions < 0:
            raise ValueError("session bounds must not be negative")
        self.max_sessions = max_sessions
        self.max_partitions = max_partitions
        #: By id, least recently used first.
        self._sessions: dict[int, FetchSession] = {}
        self.counts = counts if counts is not None else SessionCounts()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def begin(self, request: dp.FetchRequest, default_max_bytes: int) -> SessionFetch:
        """The fetch ``request`` asks for, the session's bookkeeping applied (a full fetch opens
        a session, an incremental one updates it and marks it busy). Raises
        FetchSessionIdNotFoundError / InvalidFetchSessionEpochError for an incremental fetch the
        connection cannot place; a partition's ``max_bytes`` 0 becomes ``default_max_bytes``."""
        if request.incremental:
            return self._begin_incremental(request, default_max_bytes)
        if request.session_id != dp.NO_SESSION_ID:
            self.close(request.session_id)
        partitions = tuple(
            SessionPartition(p.topic, p.partition, p.fetch_offset, p.max_bytes or default_max_bytes)
            for p in request.partitions
        )
        if request.session_epoch == dp.FINAL_EPOCH:
            return SessionFetch(None, True, partitions)
        self.counts.full_fetches += 1
        if len(partitions) > self.max_partitions or self.max_sessions == 0:
            self.counts.refused += 1
            return SessionFetch(None, True, partitions)
        while len(self._sessions) >= self.max_sessions:
            oldest = next(iter(self._sessions))
            self.close(oldest)
            self.counts.evicted += 1
        session = FetchSession(self._new_id())
        session.partitions = {(p.topic, p.partition): p for p in partitions}
        session.busy = True
        self._sessions[session.id] = session
        self.counts.opened += 1
        return SessionFetch(session, True, partitions)

    def _begin_incremental(self, request: dp.FetchRequest, default_max_bytes: int) -> SessionFetch:
        session = self._sessions.get(request.session_id)
        if session is None:
            raise errors.FetchSessionIdNotFoundError(
                f"fetch session {request.session_id} is not open on this connection "
                "(never opened, evicted or closed); send a full fetch"
            )
        if session.busy:
            raise errors.InvalidFetchSessionEpochError(
                f"fetch session {session.id} has a fetch in flight; one at a time"
            )
        if request.session_epoch != session.epoch:
            raise errors.InvalidFetchSessionEpochError(
                f"fetch session {session.id} expects epoch {session.epoch}, "
                f"not {request.session_epoch}; send a full fetch"
            )
        partitions = session.partitions
        # Distinct keys: a partition named twice (forgotten twice above all) must not count twice,
        # or a repeated forgotten entry would pay for added partitions past the cap.
        added = len({(p.topic, p.partition) for p in request.partitions} - partitions.keys())
        removed = len(set(request.forgotten) & partitions.keys())
        size = len(partitions) + added - removed
        if size > self.max_partitions:
            self.close(session.id)
            raise errors.FetchSessionIdNotFoundError(
                f"fetch session {session.id} is closed: it would hold {size} partitions, "
                f"more than this gateway's {self.max_partitions} per session; send a full fetch"
            )
        for key in request.forgotten:
            partitions.pop(key, None)
        for p in request.partitions:
            key = (p.topic, p.partition)
            known = partitions.get(key)
            if known is None:
                partitions[key] = SessionPartition(
                    p.topic, p.partition, p.fetch_offset, p.max_bytes or default_max_bytes
                )
            else:
                known.offset = p.fetch_offset
                known.max_bytes = p.max_bytes or default_max_bytes
                known.forget_answers()  # a changed partition is always answered (drops ``fetch``)
        session.epoch += 1
        session.busy = True
        self._sessions[session.id] = self._sessions.pop(session.id)  # most recently used
        self.counts.incremental_fetches += 1
        return SessionFetch(session, False, tuple(partitions.values()))

    def complete(self, fetch: SessionFetch, results: Sequence[Answered | None]) -> list[int]:
        """After the fetch was served: the indexes of ``results`` (one per partition of
        ``fetch``, in its order; None for a partition known to have nothing new) to answer,
        with the session's positions moved to what is answered, and the partitions that
        brought records moved to the end of its order."""
        session = fetch.session
        if session is None:
            return list(range(len(results)))
        session.busy = False
        answered: list[int] = []
        rotate: list[tuple[str, int]] = []
        live = not session.closed
        for index, (part, result) in enumerate(zip(fetch.partitions, results, strict=True)):
            if result is None:
                continue
            brought = result.next_offset != part.offset
            if not (
                fetch.full
                or brought
                or result.error is not None
                or result.high_watermark != part.high_watermark
                or result.last_stable_offset != part.last_stable_offset
                or result.log_start_offset != part.log_start_offset
            ):
                continue
            answered.append(index)
            if live:
                part.moved(
                    result.next_offset,
                    result.high_watermark,
                    result.last_stable_offset,
                    result.log_start_offset,
                )
                if brought:
                    rotate.append((part.topic, part.partition))
        if live:
            partitions = session.partitions
            for key in rotate:
                moved = partitions.pop(key, None)
                if moved is not None:
                    partitions[key] = moved
        return answered

    def fail(self, fetch: SessionFetch) -> None:
        """The fetch failed as a whole: its session is closed (the client starts over with a
        full fetch, as after any request-level error)."""
        session = fetch.session
        if session is not None:
            session.busy = False
            if self._sessions.get(session.id) is session:  # not replaced meanwhile
                self.close(session.id)

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.closed = True

    def close_all(self) -> None:
        for session_id in list(self._sessions):
            self.close(session_id)

    def _new_id(self) -> int:
        while True:
            session_id = secrets.randbits(31)
            if session_id != dp.NO_SESSION_ID and session_id not in self._sessions:
                return session_id
