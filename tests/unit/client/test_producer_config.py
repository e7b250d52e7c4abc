"""The producer's settings that contradict each other are refused when the producer is made."""

from __future__ import annotations

import pytest

from gateway.client.producer import ProducerConfig


@pytest.mark.parametrize(
    "settings",
    [
        {"delivery_timeout_ms": 2_000},  # below the default request timeout (30 s)
        {"delivery_timeout_ms": 10_000, "request_timeout_ms": 9_000, "linger_ms": 1_001},
        {"request_timeout_ms": 200_000},  # above the default delivery timeout (120 s)
    ],
)
def test_a_delivery_timeout_shorter_than_one_request_is_refused(settings):
    # Kafka's rule: delivery.timeout.ms >= linger.ms + request.timeout.ms; a record could
    # otherwise fail later than its delivery timeout says.
    with pytest.raises(ValueError, match=r"delivery_timeout_ms .* must be at least linger_ms"):
        ProducerConfig.from_kwargs(settings)


def test_a_delivery_timeout_of_exactly_linger_plus_request_is_taken():
    config = ProducerConfig.from_kwargs(
        {"delivery_timeout_ms": 3_000, "request_timeout_ms": 2_990, "linger_ms": 10}
    )
    assert config.delivery_timeout_ms == 3_000
