"""Subscription patterns as a rebalance sees them: matched off the event loop, kept while the
topic names stay the same, bounded; stored patterns RE2 cannot compile select nothing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from coordinator.groups import matcher as matcher_module
from coordinator.groups.matcher import TopicMatcher
from coordinator.groups.model import JoinParams, LiveTopics, Subscription
from coordinator.groups.state import GroupState
from services.clock import ManualClock


class Topics:
    """A stand-in for the store's per-revision topic counts (a new dict at every revision)."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def __call__(self) -> dict[str, int]:
        return self.counts

    def new_revision(self, counts: dict[str, int]) -> None:
        self.counts = dict(counts)


@pytest.fixture
def match_threads(monkeypatch) -> list[str]:
    """Names of the threads every pattern evaluation ran on."""
    seen: list[str] = []
    original = matcher_module._select_each

    def recording(patterns, names):
        seen.append(threading.current_thread().name)
        return original(patterns, names)

    monkeypatch.setattr(matcher_module, "_select_each", recording)
    return seen


def test_patterns_are_matched_in_a_worker_thread_and_kept_while_names_stay(match_threads):
    topics = Topics({"orders.eu": 2, "orders.us": 4, "payments": 1})
    matcher = TopicMatcher(topics)

    async def scenario() -> None:
        live = await matcher.live_topics([r"orders\..*", ""])
        assert live.select(Subscription((), r"orders\..*")) == {"orders.eu", "orders.us"}
        assert dict(live) == topics.counts
        topics.new_revision({**topics.counts, "orders.us": 8})  # a partition added: same names
        again = await matcher.live_topics([r"orders\..*"])
        assert again["orders.us"] == 8 and again.select(Subscription((), r"orders\..*")) == {
            "orders.eu",
            "orders.us",
        }
        assert len(match_threads) == 1, "same names: not matched again"
        topics.new_revision({**topics.counts, "orders.ap": 1})  # a new name: matched again
        grown = await matcher.live_topics([r"orders\..*"])
        assert grown.select(Subscription((), r"orders\..*")) == {"orders.eu", "orders.us", "orders.ap"}

    asyncio.run(scenario())
    assert len(match_threads) == 2
    assert all(name != threading.main_thread().name for name in match_threads)


def test_answers_kept_are_bounded():
    topics = Topics({f"t{i}": 1 for i in range(20)})
    matcher = TopicMatcher(topics, max_patterns=3)

    async def scenario() -> None:
        for i in range(10):
            await matcher.live_topics([f"t{i}.*"])

    asyncio.run(scenario())
    assert list(matcher._selections) == ["t7.*", "t8.*", "t9.*"]


def test_a_stored_pattern_re2_cannot_compile_selects_nothing_and_the_rest_of_the_group_is_assigned():
    # Written before patterns were RE2 (Python's re accepted lookahead): its member gets nothing.
    state = GroupState("g", ManualClock())
    live = LiveTopics({"orders": 4})
    state.join(
        JoinParams("g", subscription=Subscription((), "(?=o)orders")), live, member_id="old", lease_id=1
    )
    state.join(JoinParams("g", subscription=Subscription(("orders",))), live, member_id="new", lease_id=2)
    assert state.target.get("old", frozenset()) == frozenset()
    assert {tp.partition for tp in state.target["new"]} == {0, 1, 2, 3}


def test_live_topics_answers_for_patterns_it_was_not_given():
    live = LiveTopics({"a1": 1, "b1": 1}, {"a.*": frozenset({"a1"})})
    assert live.select(Subscription((), "a.*")) == {"a1"}
    assert live.select(Subscription((), "b.*")) == {"b1"}  # matched on the spot
    assert live.select(Subscription(("b1", "gone"))) == {"b1"}
