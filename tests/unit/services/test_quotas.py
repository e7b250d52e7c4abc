"""Client quotas, pure logic: Kafka's precedence between entities, who shares an allowance,
validation of what an admin may store, and describe filters."""

from __future__ import annotations

import math

import pytest

from services.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    ComponentFilter,
    MatchType,
    QuotaEntity,
    QuotaFilter,
    QuotaResolver,
    SensorKey,
    apply_alteration,
    candidate_entities,
    user_of,
    validate_entity,
    validate_filter,
    validate_quota_value,
)

E = QuotaEntity

#: Kafka's eight levels, most specific first, for user alice and client id app.
LEVELS = [
    E("alice", "app"),
    E("alice", DEFAULT),
    E("alice", None),
    E(DEFAULT, "app"),
    E(DEFAULT, DEFAULT),
    E(DEFAULT, None),
    E(None, "app"),
    E(None, DEFAULT),
]


def test_candidates_follow_kafkas_order():
    assert list(candidate_entities("alice", "app")) == LEVELS


@pytest.mark.parametrize("level", range(len(LEVELS)), ids=[str(e) for e in LEVELS])
def test_each_level_beats_every_level_below_it(level):
    # Every level from `level` down sets the key, each to its own value: the highest one wins.
    configs = {entity: {PRODUCER_BYTE_RATE: 1000.0 + i} for i, entity in enumerate(LEVELS) if i >= level}
    resolved = QuotaResolver(configs).resolve(PRODUCER_BYTE_RATE, "alice", "app")
    assert resolved is not None
    assert resolved.entity == LEVELS[level]
    assert resolved.limit == 1000.0 + level


def test_keys_resolve_independently():
    resolver = QuotaResolver(
        {
            E("alice", "app"): {PRODUCER_BYTE_RATE: 1.0},
            E(None, DEFAULT): {CONSUMER_BYTE_RATE: 2.0, PRODUCER_BYTE_RATE: 9.0},
        }
    )
    produce = resolver.resolve(PRODUCER_BYTE_RATE, "alice", "app")
    fetch = resolver.resolve(CONSUMER_BYTE_RATE, "alice", "app")
    assert produce is not None and produce.entity == E("alice", "app")
    assert fetch is not None and fetch.entity == E(None, DEFAULT) and fetch.limit == 2.0
    assert resolver.resolve(REQUEST_PERCENTAGE, "alice", "app") is None


def test_other_names_do_not_match():
    resolver = QuotaResolver(
        {E("bob", "app"): {PRODUCER_BYTE_RATE: 1.0}, E(None, "other"): {PRODUCER_BYTE_RATE: 2.0}}
    )
    assert resolver.resolve(PRODUCER_BYTE_RATE, "alice", "app") is None
    assert resolver.resolve(PRODUCER_BYTE_RATE, "bob", "app") is not None


@pytest.mark.parametrize(
    ("entity", "sensor"),
    [
        (E("alice", "app"), SensorKey("alice", "app")),
        # <default> gives each client id its own allowance ...
        (E("alice", DEFAULT), SensorKey("alice", "app")),
        # ... a missing part shares one across it: every client of alice together.
        (E("alice", None), SensorKey("alice", "")),
        (E(DEFAULT, "app"), SensorKey("alice", "app")),
        (E(DEFAULT, DEFAULT), SensorKey("alice", "app")),
        (E(DEFAULT, None), SensorKey("alice", "")),
        (E(None, "app"), SensorKey("", "app")),
        (E(None, DEFAULT), SensorKey("", "app")),
    ],
    ids=str,
)
def test_who_shares_an_allowance(entity, sensor):
    resolved = QuotaResolver({entity: {PRODUCER_BYTE_RATE: 5.0}}).resolve(PRODUCER_BYTE_RATE, "alice", "app")
    assert resolved is not None and resolved.sensor == sensor


def test_principal_names_are_users():
    assert user_of("User:alice") == "alice"
    assert user_of("User:ANONYMOUS") == "ANONYMOUS"


@pytest.mark.parametrize(
    ("key", "value", "stored"),
    [
        (PRODUCER_BYTE_RATE, 1048576, 1048576.0),
        (CONSUMER_BYTE_RATE, 1.0, 1.0),
        (REQUEST_PERCENTAGE, 12.5, 12.5),
        (REQUEST_PERCENTAGE, 250, 250.0),
    ],
)
def test_valid_values(key, value, stored):
    assert validate_quota_value(key, value) == stored


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        (PRODUCER_BYTE_RATE, -1, "must be positive"),
        (CONSUMER_BYTE_RATE, 0, "must be positive"),
        (REQUEST_PERCENTAGE, -0.5, "must be positive"),
        (PRODUCER_BYTE_RATE, 10.5, "whole number"),
        (PRODUCER_BYTE_RATE, math.inf, "finite"),
        (REQUEST_PERCENTAGE, math.nan, "finite"),
        (PRODUCER_BYTE_RATE, True, "finite number"),
        ("producer_byte_rat", 1, "unknown quota key 'producer_byte_rat'"),
        ("controller_mutation_rate", 1, "unknown quota key"),
    ],
)
def test_invalid_values_are_refused_with_the_key_named(key, value, says):
    with pytest.raises(ValueError, match=says):
        validate_quota_value(key, value)


@pytest.mark.parametrize(
    ("entity", "says"),
    [
        (E(None, None), "needs a user, a client id, or both"),
        (E("", None), "user of a quota entity must be a name"),
        (E(None, ""), "client-id of a quota entity must be a name"),
        (E("x" * 1025, None), "at most 1024"),
    ],
)
def test_invalid_entities(entity, says):
    with pytest.raises(ValueError, match=says):
        validate_entity(entity)


def test_alteration_sets_and_removes():
    values = apply_alteration(
        {PRODUCER_BYTE_RATE: 5.0}, [(CONSUMER_BYTE_RATE, 7), (PRODUCER_BYTE_RATE, None)]
    )
    assert values == {CONSUMER_BYTE_RATE: 7.0}
    with pytest.raises(ValueError, match="appears twice"):
        apply_alteration({}, [(PRODUCER_BYTE_RATE, 1), (PRODUCER_BYTE_RATE, None)])
    with pytest.raises(ValueError, match="unknown quota key"):
        apply_alteration({}, [("bogus", None)])


def test_describe_filters():
    entities = [E("alice", None), E("alice", "app"), E(DEFAULT, None), E(None, "app"), E(None, DEFAULT)]
    resolver = QuotaResolver({e: {PRODUCER_BYTE_RATE: 1.0} for e in entities})

    def found(*components, strict=False):
        return [e for e, _ in resolver.matching(QuotaFilter(tuple(components), strict))]

    assert len(found()) == len(entities)
    assert found(strict=True) == []
    assert found(ComponentFilter(USER, MatchType.EXACT, "alice")) == [E("alice", None), E("alice", "app")]
    assert found(ComponentFilter(USER, MatchType.EXACT, "alice"), strict=True) == [E("alice", None)]
    assert found(ComponentFilter(USER, MatchType.DEFAULT)) == [E(DEFAULT, None)]
    assert set(found(ComponentFilter(CLIENT_ID, MatchType.SPECIFIED))) == {E("alice", "app"), E(None, "app")}
    with pytest.raises(ValueError, match="unknown entity type"):
        validate_filter(QuotaFilter((ComponentFilter("ip", MatchType.EXACT, "1.2.3.4"),)))
    with pytest.raises(ValueError, match="needs a name"):
        validate_filter(QuotaFilter((ComponentFilter(USER, MatchType.EXACT),)))
