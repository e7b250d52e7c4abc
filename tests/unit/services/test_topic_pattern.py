"""Subscription patterns: RE2 syntax, whole-name matches, and clear refusals of what RE2 (or Java)
would read differently or could not bound."""

import pytest

from services.errors import InvalidRequestError
from services.topic_pattern import MAX_PATTERN_LENGTH, compile_topic_pattern

P = pytest.param


@pytest.mark.parametrize(
    ("pattern", "selected"),
    [
        P("orders", {"orders"}, id="a-name-is-only-itself"),
        P(r"orders\..*", {"orders.eu", "orders.us"}, id="prefix"),
        P("orders.*", {"orders", "orders.eu", "orders.us", "orders-archive"}, id="dot-star"),
        P(".*eu", {"orders.eu", "payments-eu"}, id="suffix-means-whole-name"),
        P("(?i)ORDERS", {"orders"}, id="inline-flag"),
        P(r"\Qorders.eu\E", {"orders.eu"}, id="quoted"),
        P("[a-z]+[.][a-z]+", {"orders.eu", "orders.us"}, id="class"),
    ],
)
def test_a_pattern_selects_topics_whose_whole_name_matches(pattern, selected):
    topics = ["orders", "orders.eu", "orders.us", "payments-eu", "orders-archive", "x-orders"]
    compiled = compile_topic_pattern(pattern)
    assert compiled.select(topics) == selected
    assert {t for t in topics if compiled.matches(t)} == selected


def test_the_catastrophic_backtracking_case_is_an_ordinary_match():
    # (a+)+ against "a"*29 + "-" is exponential for a backtracking engine (22 s in Python's re);
    # RE2 answers like any other pattern.
    compiled = compile_topic_pattern("(a+)+")
    assert not compiled.matches("a" * 29 + "-")
    assert compiled.matches("a" * 249)
    assert compiled.select(["a" * n + "-" for n in range(1, 249)]) == frozenset()


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        P("", "non-empty", id="empty"),
        P("x" * (MAX_PATTERN_LENGTH + 1), "at most 1000", id="too-long"),
        P("(a", "missing )", id="unbalanced"),
        P("(?=a)a", "invalid perl operator", id="lookahead"),
        P("(?<=a)b", "invalid perl operator", id="lookbehind"),
        P(r"(a)\1", "invalid escape", id="backreference"),
        P("a*+", "bad repetition", id="possessive"),
        P("(?>a)", "invalid perl operator", id="atomic-group"),
        P(r"a\Z", "invalid escape", id="python-end-anchor"),
        P("[a-z&&[^e]]", "'&&' inside a character class", id="java-intersection"),
        P("[a-c[x-z]]", "'[' inside a character class", id="java-nested-class"),
        P("[[:alpha:]]", "'[' inside a character class", id="posix-class-java-reads-as-nested"),
        P("[a-z]{1,1000}" * 41, "KiB a pattern may use", id="compiles-too-large"),
    ],
)
def test_what_is_not_a_pattern_is_refused_with_the_reason(pattern, fragment):
    with pytest.raises(InvalidRequestError) as info:
        compile_topic_pattern(pattern)
    assert fragment in info.value.message
    assert info.value.reason == "INVALID_REQUEST"


@pytest.mark.parametrize("pattern", ["[]a]", "[^]a]", r"[\[a]", r"\Q[&&\E", "a&&b", "[&]"])
def test_brackets_and_ampersands_that_mean_the_same_in_java_are_accepted(pattern):
    compile_topic_pattern(pattern)


def test_compiled_patterns_are_cached():
    assert compile_topic_pattern("cached-.*") is compile_topic_pattern("cached-.*")


def test_a_pattern_of_the_longest_accepted_length_compiles():
    names = [f"topic-{i:03d}" for i in range(100)]
    pattern = "|".join(names[:100])  # 999 characters: an explicit list of a hundred topics
    assert len(pattern) == MAX_PATTERN_LENGTH - 1
    assert compile_topic_pattern(pattern + "x").select(names) == frozenset(names[:99])
