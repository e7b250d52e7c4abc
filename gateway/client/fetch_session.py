"""The SDK's side of a fetch session (KIP-227, data protocol version 3): pure bookkeeping.

The consumer decides before every fetch which partitions it wants and from which offsets (the
fetcher's candidates). The gateway keeps a session of partitions and positions, so this class
keeps the same picture -- what the session holds, as the gateway sees it -- and turns the full
wish list into the difference: partitions added or whose offset or size changed, and partitions
forgotten. It follows every answer as the gateway does: an answered partition's position becomes
the answer's ``next_offset``; the others stay.

Whenever the picture may be wrong -- an answer not read (a fetch given up on after a seek, a
timeout), a request-level error, a session error, a new connection -- :meth:`reset` makes the
next fetch a full one, which replaces the session. Nothing else is needed for correctness: a
position the consumer wants elsewhere (a seek, a rebalance, records it dropped) differs from the
picture and is sent again.
"""

from __future__ import annotations

from services.dataport import protocol as dp


class FetchSessionState:
    """One session's picture on the client side; not thread-safe (the fetch routine's)."""

    __slots__ = ("_pending", "epoch", "positions", "session_id")

    def __init__(self) -> None:
        self.session_id = dp.NO_SESSION_ID
        #: The epoch of the next fetch: ``INITIAL_EPOCH`` = a full fetch.
        self.epoch = dp.INITIAL_EPOCH
        #: (topic, partition) -> the partition as the gateway holds it in the session (its fetch
        #: offset and max bytes; a ``FetchPartition``: the fetcher passes the same tuple again
        #: while the partition's offset holds, which makes the comparison an identity check).
        self.positions: dict[tuple[str, int], dp.FetchPartition] = {}
        #: The picture once the request in flight is applied (None: nothing in flight).
        self._pending: dict[tuple[str, int], dp.FetchPartition] | None = None

    @property
    def full(self) -> bool:
        """The next fetch is a full one."""
        return self.epoch == dp.INITIAL_EPOCH

    def request(self, wanted: dp.FetchRequest) -> dp.FetchRequest:
        """``wanted`` (every partition the consumer fetches, at its offsets) as this session's
        next fetch: all of it for a full fetch, else only the difference from the session."""
        # One pass over every wanted partition (before each fetch of a consumer of hundreds).
        pending: dict[tuple[str, int], dp.FetchPartition] = {}
        self._pending = pending
        if self.full:
            for p in wanted.partitions:
                pending[p[:2]] = p
            return wanted._replace(session_id=self.session_id, session_epoch=dp.INITIAL_EPOCH, forgotten=())
        positions = self.positions
        get = positions.get
        changed = []
        for p in wanted.partitions:
            key = p[:2]  # (topic, partition)
            pending[key] = p
            known = get(key)
            if known is not p and known != p:
                changed.append(p)
        # Every partition of the session still wanted (the usual case): nothing is forgotten.
        forgotten: tuple[tuple[str, int], ...] = ()
        if len(pending) != len(positions) or len(changed):
            forgotten = tuple(key for key in positions if key not in pending)
        return wanted._replace(
            partitions=changed, session_id=self.session_id, session_epoch=self.epoch, forgotten=forgotten
        )

    def answered(self, response: dp.FetchResponse) -> None:
        """Follow the answer of the fetch :meth:`request` built (an answer with a request-level
        error resets the session instead)."""
        pending, self._pending = self._pending, None
        if pending is None or response.error_code != 0:
            self.reset()
            return
        if self.full:
            self.session_id = response.session_id
            if self.session_id == dp.NO_SESSION_ID:  # the gateway would not open one
                self.positions = {}
                return
            self.epoch = 1
        else:
            self.epoch += 1
        for p in response.partitions:
            key = (p.topic, p.partition)
            known = pending.get(key)
            if known is not None and known.fetch_offset != p.next_offset:
                pending[key] = known._replace(fetch_offset=p.next_offset)
        self.positions = pending

    def reset(self) -> None:
        """The next fetch is a full one, replacing the session (its id is sent to close it)."""
        self.epoch = dp.INITIAL_EPOCH
        self.positions = {}
        self._pending = None
