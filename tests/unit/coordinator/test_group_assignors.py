"""Assignors: hand-worked cases (the paper's Algorithm 1 for range) and property checks."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.groups.assignors import ASSIGNORS, MemberSubscription, range_assignor, round_robin, sticky
from services.topic_partition import TopicPartition as TP


def members(*ids: str, topics=("t",)) -> list[MemberSubscription]:
    return [MemberSubscription(i, frozenset(topics)) for i in ids]


def parts(topic: str, *ps: int) -> frozenset[TP]:
    return frozenset(TP(topic, p) for p in ps)


# ---- range: the paper's Algorithm 1 ---------------------------------------------------------------


def test_range_algorithm_1_even_split():
    """|P_T| = 6, |C_T| = 3: N = 2, member j takes [j*N, (j+1)*N - 1] of the sorted lists."""
    result = range_assignor.assign(members("c3", "c1", "c2"), {"t": 6})
    assert result == {"c1": parts("t", 0, 1), "c2": parts("t", 2, 3), "c3": parts("t", 4, 5)}


def test_range_remainder_goes_to_the_first_members():
    """10 partitions over 3 members: N = 3, and the one left over goes to the first (Kafka)."""
    result = range_assignor.assign(members("c1", "c2", "c3"), {"t": 10})
    assert result == {"c1": parts("t", 0, 1, 2, 3), "c2": parts("t", 4, 5, 6), "c3": parts("t", 7, 8, 9)}


def test_range_is_per_topic_and_only_among_subscribers():
    ms = [MemberSubscription("a", frozenset({"x", "y"})), MemberSubscription("b", frozenset({"x"}))]
    result = range_assignor.assign(ms, {"x": 3, "y": 2})
    assert result == {"a": parts("x", 0, 1) | parts("y", 0, 1), "b": parts("x", 2)}


def test_range_orders_static_members_by_instance_id():
    ms = [
        MemberSubscription("zzz-1", frozenset({"t"}), "i-a"),
        MemberSubscription("aaa-2", frozenset({"t"}), "i-b"),
    ]
    assert range_assignor.assign(ms, {"t": 4})["zzz-1"] == parts("t", 0, 1)


def test_more_members_than_partitions_leaves_some_empty():
    result = range_assignor.assign(members("a", "b", "c"), {"t": 2})
    assert result == {"a": parts("t", 0), "b": parts("t", 1), "c": frozenset()}


# ---- round robin ------------------------------------------------------------------------------------


def test_round_robin_deals_in_turn():
    result = round_robin.assign(members("a", "b", topics=("t", "u")), {"t": 3, "u": 2})
    assert result == {"a": parts("t", 0, 2) | parts("u", 1), "b": parts("t", 1) | parts("u", 0)}


def test_round_robin_skips_members_not_subscribed():
    ms = [MemberSubscription("a", frozenset({"t"})), MemberSubscription("b", frozenset({"t", "u"}))]
    result = round_robin.assign(ms, {"t": 2, "u": 2})
    assert result == {"a": parts("t", 0), "b": parts("t", 1) | parts("u", 0, 1)}


# ---- sticky -----------------------------------------------------------------------------------------


def test_sticky_fourth_member_takes_only_what_balance_requires():
    previous = {"a": parts("t", 0, 1), "b": parts("t", 2, 3), "c": parts("t", 4, 5)}
    result = sticky.assign(members("a", "b", "c", "d"), {"t": 6}, previous)
    moved = [tp for m in "abc" for tp in previous[m] - result[m]]
    assert len(moved) == 1 and result["d"] == frozenset(moved)
    assert sorted(len(v) for v in result.values()) == [1, 1, 2, 2]


def test_sticky_member_leaving_only_its_partitions_move():
    previous = {"a": parts("t", 0, 1), "b": parts("t", 2, 3), "c": parts("t", 4, 5)}
    result = sticky.assign(members("a", "b"), {"t": 6}, previous)
    assert previous["a"] <= result["a"] and previous["b"] <= result["b"]
    assert result["a"] | result["b"] == parts("t", *range(6)) and len(result["a"]) == len(result["b"]) == 3


def test_sticky_drops_partitions_of_unsubscribed_or_deleted_topics():
    previous = {"a": parts("t", 0, 1) | parts("gone", 0), "b": parts("t", 2, 3)}
    result = sticky.assign(members("a", "b"), {"t": 4}, previous)
    assert result == {"a": parts("t", 0, 1), "b": parts("t", 2, 3)}


def test_sticky_heterogeneous_subscriptions_place_constrained_partitions_first():
    ms = [MemberSubscription("a", frozenset({"t"})), MemberSubscription("b", frozenset({"t", "u"}))]
    result = sticky.assign(ms, {"t": 2, "u": 2}, {})
    assert result == {"a": parts("t", 0, 1), "b": parts("u", 0, 1)}


# ---- properties ------------------------------------------------------------------------------------

TOPICS = ["t0", "t1", "t2"]


@st.composite
def scenarios(draw, homogeneous: bool):
    counts = {t: draw(st.integers(0, 12)) for t in draw(st.sets(st.sampled_from(TOPICS), min_size=1))}
    member_ids = draw(
        st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=7, unique=True)
    )
    if homogeneous:
        ms = [MemberSubscription(m, frozenset(counts)) for m in member_ids]
    else:
        ms = [
            MemberSubscription(m, frozenset(draw(st.sets(st.sampled_from(sorted(counts)), min_size=1))))
            for m in member_ids
        ]
    # A previous assignment over some old members (some gone), partitions possibly of old topics.
    old_ids = draw(st.lists(st.sampled_from(member_ids + ["gone1", "gone2"]), unique=True))
    pool = [TP(t, p) for t in TOPICS for p in range(12)]
    previous: dict[str, frozenset] = {}
    taken: set = set()
    for m in old_ids:
        mine = frozenset(draw(st.sets(st.sampled_from(pool), max_size=8))) - taken
        taken |= mine
        previous[m] = mine
    return ms, counts, previous


def assert_valid(ms, counts, result):
    assert set(result) == {m.member_id for m in ms}
    everything = [tp for tps in result.values() for tp in tps]
    subscribed = set().union(*(m.topics for m in ms))
    expected = {TP(t, p) for t in counts if t in subscribed for p in range(counts[t])}
    assert Counter(everything) == Counter(expected), "every subscribed partition exactly once"
    by_id = {m.member_id: m for m in ms}
    assert all(tp.topic in by_id[m].topics for m, tps in result.items() for tp in tps), (
        "only subscribed topics"
    )


def assert_balanced_within_one(result):
    sizes = [len(v) for v in result.values()]
    assert max(sizes) - min(sizes) <= 1


def assert_no_improving_move(ms, result):
    by_id = {m.member_id: m for m in ms}
    for giver, tps in result.items():
        for taker, theirs in result.items():
            if len(tps) - len(theirs) >= 2:
                assert not any(tp.topic in by_id[taker].topics for tp in tps), (giver, taker)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@settings(max_examples=80, deadline=None)
@given(scenario=scenarios(homogeneous=True))
def test_every_assignor_is_valid_and_balanced_for_identical_subscriptions(name, scenario):
    ms, counts, previous = scenario
    result = ASSIGNORS[name](ms, counts, previous)
    assert_valid(ms, counts, result)
    if name == "range":
        for topic in counts:  # range balances each topic, not the total
            assert_balanced_within_one({m: {tp for tp in v if tp.topic == topic} for m, v in result.items()})
    else:
        assert_balanced_within_one(result)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@settings(max_examples=80, deadline=None)
@given(scenario=scenarios(homogeneous=False))
def test_every_assignor_is_valid_for_any_subscriptions(name, scenario):
    ms, counts, previous = scenario
    assert_valid(ms, counts, ASSIGNORS[name](ms, counts, previous))


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(homogeneous=False))
def test_sticky_leaves_no_improving_move(scenario):
    ms, counts, previous = scenario
    assert_no_improving_move(ms, sticky.assign(ms, counts, previous))


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(homogeneous=True))
def test_sticky_keeps_everything_balance_allows(scenario):
    """A member keeps every partition it had, unless its new (balanced) share is smaller: then it
    keeps as many as that share holds, and gets nothing new."""
    ms, counts, previous = scenario
    result = sticky.assign(ms, counts, previous)
    for m in ms:
        had = {
            tp
            for tp in previous.get(m.member_id, ())
            if tp.topic in counts and tp.partition < counts[tp.topic]
        }
        kept = had & result[m.member_id]
        assert len(kept) == min(len(had), len(result[m.member_id])), m.member_id


@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(homogeneous=True))
def test_sticky_is_stable_when_nothing_changes(scenario):
    ms, counts, previous = scenario
    first = sticky.assign(ms, counts, previous)
    assert sticky.assign(ms, counts, first) == first


def test_assignors_are_deterministic_and_keep_no_state():
    ms, counts = members("a", "b", "c"), {"t": 7}
    for assign in ASSIGNORS.values():
        assert assign(ms, counts, {}) == assign(list(reversed(ms)), counts, {})
