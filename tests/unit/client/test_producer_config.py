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


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sasl_mechanism": "OAUTHBEARER"}, "need security_protocol='SASL_SSL'"),
        ({"sasl_oauth_token_provider": "t"}, "need security_protocol='SASL_SSL'"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "needs sasl_mechanism"),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
            "needs a sasl_oauth_token_provider",
        ),
        (
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "OAUTHBEARER",
                "sasl_oauth_token_provider": 5,
            },
            "must be a token string",
        ),
        ({"security_protocol": "SASL_PLAINTEXT"}, "not supported"),
    ],
)
def test_sasl_settings_that_do_not_add_up_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ProducerConfig.from_kwargs(settings)


def test_a_token_source_reuses_a_token_until_shortly_before_it_expires():
    import json as _json
    from base64 import urlsafe_b64encode

    from gateway.client.credentials import REFRESH_BEFORE_EXPIRY_S, TokenSource

    now = [1_000.0]
    handed = []

    def provider():
        expires = now[0] + 300
        claims = urlsafe_b64encode(_json.dumps({"sub": "a", "exp": expires}).encode()).rstrip(b"=").decode()
        handed.append(f"h.{claims}.s{len(handed)}")
        return handed[-1]

    source = TokenSource(provider, clock=lambda: now[0])
    first = source.token()
    now[0] += 300 - REFRESH_BEFORE_EXPIRY_S - 1
    assert source.token() == first and len(handed) == 1
    now[0] += 2
    assert source.token() != first and len(handed) == 2
    assert TokenSource(lambda: "opaque", clock=lambda: now[0]).token() == "opaque"
    with pytest.raises(ValueError, match="gave no token"):
        TokenSource(lambda: "", clock=lambda: now[0]).token()
