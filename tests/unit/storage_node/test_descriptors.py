"""The descriptor rule: the fetch port's share of RLIMIT_NOFILE (storage_node/descriptors.py)."""

from __future__ import annotations

import pytest

from services.config import ConfigError
from storage_node.descriptors import MIN_OTHER_DESCRIPTORS, DescriptorBudget


@pytest.mark.parametrize(
    "limit, expected",
    [
        (1 << 20, 1 << 18),  # a container's usual limit: a quarter of it
        (20_000, 5_000),
        (4_096, 1_024),
        (2_048, (2_048 - 1_024 - MIN_OTHER_DESCRIPTORS) // 2),  # the segment cache needs more than half
    ],
)
def test_the_fetch_port_gets_at_most_half_the_descriptors_and_leaves_the_log_its_share(limit, expected):
    budget = DescriptorBudget.plan(limit, max_open_segments=1024)
    assert budget.fetch_connections == expected
    assert budget.reserved == limit - 2 * expected
    assert budget.reserved >= max(limit // 2, 1024 + MIN_OTHER_DESCRIPTORS)


def test_an_explicit_cap_is_honoured_when_it_fits_and_refused_when_it_does_not():
    assert (
        DescriptorBudget.plan(20_000, max_open_segments=1024, fetch_max_connections=300).fetch_connections
        == 300
    )
    with pytest.raises(ConfigError, match=r"fetch.max.connections=5001 does not fit .* at most 5000"):
        DescriptorBudget.plan(20_000, max_open_segments=1024, fetch_max_connections=5001)
    with pytest.raises(ConfigError, match="must not be negative"):
        DescriptorBudget.plan(20_000, max_open_segments=1024, fetch_max_connections=-1)


def test_a_limit_too_small_for_the_segment_cache_is_a_clear_start_error():
    with pytest.raises(
        ConfigError, match=r"descriptor limit \(1024, ulimit -n\) cannot hold max.open.segments"
    ):
        DescriptorBudget.plan(1024, max_open_segments=1024)
    assert DescriptorBudget.plan(1024, max_open_segments=128).fetch_connections == 256


def test_max_open_segments_defaults_to_a_quarter_of_the_limit():
    from storage_node.descriptors import resolve_max_open_segments

    assert resolve_max_open_segments(0, 20_000) == 5_000
    assert resolve_max_open_segments(0, 1 << 20) == 1 << 18
    assert resolve_max_open_segments(300, 20_000) == 300  # set explicitly: honoured
    for limit in (1_024, 2_048, 20_000):  # the default always leaves the fetch port its share
        assert DescriptorBudget.plan(
            limit, max_open_segments=resolve_max_open_segments(0, limit)
        ).fetch_connections
    with pytest.raises(ConfigError, match=r"max\.open\.segments"):
        resolve_max_open_segments(-1, 20_000)
