"""Which live topics each subscription pattern selects: matched off the event loop, and kept
while the topic names stay the same.

Every metadata change (a leader moving, a node joining, a partition added) makes the group
manager rebalance the groups with members, and a rebalance needs every member's subscription
resolved. Matching a pattern is linear in the topics (RE2, :mod:`services.topic_pattern`) but
adds up: about 1 µs per topic and pattern, so 10,000 topics are ~10 ms a pattern and a hundred
patterns ~1 s (bench/bounds.py). Run on the event loop, that would hold up heartbeats and the
controller's lease keep-alive. So:

* matching runs in a worker thread (``asyncio.to_thread``; RE2 releases the GIL while it
  compiles and matches), never on the loop;
* answers are kept per pattern until the *set of topic names* changes -- most metadata changes
  rename nothing, and then no pattern is matched again -- and shared by every group using the
  pattern; at most ``max_patterns`` answers are kept (least recently used dropped).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from coordinator.groups.model import LiveTopics, select_matching

#: Pattern answers kept (each a frozenset of topic names).
MAX_PATTERNS = 256


class TopicMatcher:
    """Pattern answers over the live topics ``topics()`` returns. One event loop; not thread-safe
    (only the matching itself runs in threads, on values it does not share)."""

    def __init__(self, topics: Callable[[], Mapping[str, int]], *, max_patterns: int = MAX_PATTERNS) -> None:
        self._topics = topics
        self._max_patterns = max_patterns
        self._selections: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._counts: Mapping[str, int] | None = None
        self._names: frozenset[str] = frozenset()
        #: Bumped whenever the topic names change (and every answer is dropped).
        self._generation = 0

    async def live_topics(self, patterns: Iterable[str]) -> LiveTopics:
        """The live topics now, with every pattern in ``patterns`` matched ("" is skipped)."""
        counts = self._topics()
        self._follow(counts)
        wanted = {p for p in patterns if p}
        known = {p: self._recall(p) for p in wanted if p in self._selections}
        missing = sorted(wanted - known.keys())
        if not missing:
            return LiveTopics(counts, known)
        generation = self._generation
        found = await asyncio.to_thread(_select_each, missing, tuple(counts))
        if generation == self._generation:  # the names did not change meanwhile
            for pattern, selected in found.items():
                self._remember(pattern, selected)
        return LiveTopics(counts, {**known, **found})

    def _follow(self, counts: Mapping[str, int]) -> None:
        """Drop every answer when the topic names changed since the last call."""
        if counts is self._counts:
            return
        self._counts = counts
        if counts.keys() != self._names:
            self._names = frozenset(counts)
            self._selections.clear()
            self._generation += 1

    def _recall(self, pattern: str) -> frozenset[str]:
        self._selections.move_to_end(pattern)
        return self._selections[pattern]

    def _remember(self, pattern: str, selected: frozenset[str]) -> None:
        self._selections[pattern] = selected
        while len(self._selections) > self._max_patterns:
            self._selections.popitem(last=False)


def _select_each(patterns: Sequence[str], names: Sequence[str]) -> dict[str, frozenset[str]]:
    """Each pattern's matches among ``names`` (runs in a worker thread)."""
    return {pattern: select_matching(pattern, names) for pattern in patterns}
