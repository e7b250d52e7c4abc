"""Authentication at the gateway: who a caller is.

A gateway knows its callers in one of two ways (Kafka's SSL and SASL_SSL listeners):

* **certificates** (mutual TLS, ``--tls-client-ca-file``): the principal is the client
  certificate's common name (``User:<CN>``); without TLS client certificates every caller is
  ``User:ANONYMOUS``;
* **bearer tokens** (``--token-public-key-file``, ``services/tokens.py``): every gRPC call must
  carry ``authorization: Bearer <token>`` and every raw data connection a token in its
  handshake, signed with the configured key and unexpired; the principal is ``User:<sub>``. A
  call without a valid token is refused UNAUTHENTICATED (SASL_AUTHENTICATION_FAILED) before its
  handler runs, whatever the authorizer would say. The health service stays open (load
  balancers and Kubernetes probes hold no token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc

from gateway.server.authorization import certificate_principal, grpc_principal
from services import errors
from services.tokens import TokenVerifier

#: Calls that need no token: probes of the gateway's health.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The token of an ``authorization: Bearer <token>`` metadata entry; refused when absent."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        raise errors.SaslAuthenticationFailedError(
            "the call's authorization metadata is not 'Bearer <token>'"
        )
    raise errors.SaslAuthenticationFailedError(
        "this gateway authenticates callers by bearer token and the call carries none "
        "(authorization: Bearer <token>; the SDK: security_protocol='SASL_SSL', "
        "sasl_mechanism='OAUTHBEARER', sasl_oauth_token_provider=...)"
    )


class Authenticator:
    """The principal of a gRPC call or a data connection, by certificate or by token."""

    def __init__(self, verifier: TokenVerifier | None = None) -> None:
        self.verifier = verifier

    @property
    def by_token(self) -> bool:
        return self.verifier is not None

    def call_principal(self, context) -> str:
        """The principal of a gRPC call (SaslAuthenticationFailedError when its token fails)."""
        if self.verifier is None:
            return grpc_principal(context)
        return self.verifier.verify(bearer_token(context.invocation_metadata())).principal

    def connection_principal(self, auth_token: str, peercert: dict | None) -> tuple[str, float | None]:
        """A data connection's principal and when its credentials expire (None: never), from
        its handshake's token or its TLS certificate."""
        if self.verifier is None:
            return certificate_principal(peercert), None
        if not auth_token:
            raise errors.SaslAuthenticationFailedError(
                "this gateway authenticates data connections by bearer token and the handshake carries none"
            )
        verified = self.verifier.verify(auth_token)
        return verified.principal, verified.expires_at


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call without a valid bearer token, before its handler runs."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        try:
            self._verifier.verify(bearer_token(handler_call_details.invocation_metadata))
        except errors.SaslAuthenticationFailedError as exc:
            return _refusing(handler, exc)
        return handler


def _refusing(handler: grpc.RpcMethodHandler, error: errors.TributaryError) -> grpc.RpcMethodHandler:
    """A handler of the same shape that answers ``error`` and never runs the real one."""
    status = errors.to_status(error)

    async def refuse_unary(request_or_iterator, context):
        await context.abort_with_status(status)

    async def refuse_streaming(request_or_iterator, context):
        await context.abort_with_status(status)
        yield  # pragma: no cover -- makes this an async generator; abort raises first

    common = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse_unary, **common)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_streaming, **common)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse_unary, **common)
    return grpc.stream_stream_rpc_method_handler(refuse_streaming, **common)
