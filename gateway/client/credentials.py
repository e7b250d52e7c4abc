"""A client's bearer token (Kafka's ``sasl_mechanism="OAUTHBEARER"``): where it comes from and
how long it is reused.

``sasl_oauth_token_provider`` is a token string, a callable returning one, or an object with a
``token()`` method (kafka-python's and aiokafka's provider shape). The SDK asks it for a token
when it has none or the one it has is within :data:`REFRESH_BEFORE_EXPIRY_S` of its ``exp``
claim, so a provider may fetch from an identity provider without being called per request.
The token goes with every gRPC call (``authorization: Bearer <token>``) and in the raw data
connection's handshake; a gateway closes a data connection whose token expired, and the SDK's
reconnect asks for a fresh one.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

#: The SASL mechanisms a client may name (only bearer tokens so far).
SASL_MECHANISMS = ("OAUTHBEARER",)
#: A token is asked for again this long before it expires.
REFRESH_BEFORE_EXPIRY_S = 60.0
#: A token whose expiry cannot be read is reused this long.
REUSE_UNKNOWN_EXPIRY_S = 30.0


def _expiry(token: str) -> float | None:
    """The ``exp`` claim, read without verifying (only to know when to ask again)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        expires_at = claims.get("exp") if isinstance(claims, dict) else None
    except (IndexError, ValueError, binascii.Error, UnicodeDecodeError):
        return None
    return float(expires_at) if isinstance(expires_at, int | float) else None


class TokenSource:
    """The token to present now; thread-safe (gRPC calls its credentials plugin on its threads)."""

    def __init__(self, provider: Any, *, clock: Callable[[], float] = time.time) -> None:
        if isinstance(provider, str):
            self._fetch: Callable[[], Any] = lambda: provider
        elif callable(getattr(provider, "token", None)):
            self._fetch = provider.token
        elif callable(provider):
            self._fetch = provider
        else:
            raise ValueError(
                "sasl_oauth_token_provider must be a token string, a callable returning one, or an "
                "object with a token() method"
            )
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._reuse_until = 0.0

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._reuse_until:
                token = self._fetch()
                if not isinstance(token, str) or not token:
                    raise ValueError(
                        "the sasl_oauth_token_provider gave no token (an empty or non-string value)"
                    )
                expires_at = _expiry(token)
                self._token = token
                self._reuse_until = (
                    now + REUSE_UNKNOWN_EXPIRY_S
                    if expires_at is None
                    else max(now, expires_at - REFRESH_BEFORE_EXPIRY_S)
                )
            return self._token


def client_token_source(
    security_protocol: str, sasl_mechanism: str | None, provider: Any
) -> TokenSource | None:
    """The bearer token the settings ask for: None without SASL; ValueError for settings that
    do not add up (never ignored)."""
    protocol = security_protocol.upper()
    if protocol != "SASL_SSL":
        if sasl_mechanism is not None or provider is not None:
            raise ValueError(
                f"sasl_mechanism and sasl_oauth_token_provider need security_protocol='SASL_SSL' "
                f"(it is {security_protocol})"
            )
        return None
    if (sasl_mechanism or "").upper() not in SASL_MECHANISMS:
        raise ValueError(f"security_protocol='SASL_SSL' needs sasl_mechanism in {SASL_MECHANISMS}")
    if provider is None:
        raise ValueError("sasl_mechanism='OAUTHBEARER' needs a sasl_oauth_token_provider")
    return TokenSource(provider)


class _BearerToken(grpc.AuthMetadataPlugin):
    """gRPC call credentials from a TokenSource (called on gRPC's threads, per call)."""

    def __init__(self, source: TokenSource) -> None:
        self._source = source

    def __call__(self, context, callback) -> None:
        try:
            token = self._source.token()
        except Exception as exc:  # noqa: BLE001 -- the provider's failure fails the call, named
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),), None)


def bearer_call_credentials(source: TokenSource) -> grpc.CallCredentials:
    """``authorization: Bearer <token>`` on every call of a channel (compose with TLS ones)."""
    return grpc.metadata_call_credentials(_BearerToken(source))
