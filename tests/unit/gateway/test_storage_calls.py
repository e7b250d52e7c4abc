"""The gateway's calls to storage nodes: a failed call becomes each partition's error."""

from __future__ import annotations

import asyncio

import grpc

from gateway.server import storage_calls
from services import errors
from services.acks import Acks


class _CancelledCall(grpc.RpcError):
    """What grpc.aio raises when the server cancels the call (no ErrorInfo in the trailers)."""

    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "CANCELLED"

    def trailing_metadata(self):
        return ()


class _StoppingNode:
    """A storage node's stub whose Append is cancelled by the node shutting down."""

    async def Append(self, request, timeout):
        raise _CancelledCall()


def test_append_cancelled_by_a_stopping_node_is_retried_not_failed():
    results = asyncio.run(
        storage_calls.append(_StoppingNode(), "t", {0: b"x", 1: b"y"}, acks=Acks.ALL, timeout_s=1.0)
    )
    assert set(results) == {0, 1}
    for result in results.values():
        assert isinstance(result.error, errors.NetworkError)
        assert result.error.retriable  # the produce retry loop sends it again (idempotent: no duplicate)
