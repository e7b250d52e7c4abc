"""Gateway failover: which failures move a client to another gateway, and the quarantine."""

import asyncio

import grpc

from gateway.client.channel import MAX_QUARANTINE_S, GatewayPool, is_transport_failure
from services import errors
from services.clock import ManualClock


class _RpcError(grpc.RpcError):
    def __init__(self, code, trailers=()):
        self._code, self._trailers = code, trailers

    def code(self):
        return self._code

    def details(self):
        return "details"

    def trailing_metadata(self):
        return self._trailers


def test_transport_failures_are_unavailable_or_cancelled_without_our_detail():
    assert is_transport_failure(_RpcError(grpc.StatusCode.UNAVAILABLE))
    assert is_transport_failure(_RpcError(grpc.StatusCode.CANCELLED))
    assert not is_transport_failure(_RpcError(grpc.StatusCode.DEADLINE_EXCEEDED))
    status = errors.to_status(errors.NotEnoughReplicasError("the gateway answered"))
    assert not is_transport_failure(_RpcError(grpc.StatusCode.UNAVAILABLE, status.trailing_metadata))


def test_failed_endpoints_are_skipped_for_a_growing_quarantine():
    async def scenario():
        clock = ManualClock()
        pool = GatewayPool(["a:1", "b:2", "c:3"], monotonic=clock.monotonic)
        try:
            a, b, c = pool.endpoints
            assert pool.current() is a
            pool.mark_failed(a)
            assert pool.current() is b, "a client moves on at once"
            pool.mark_failed(b)
            pool.mark_failed(c)
            assert pool.current() is a, "all quarantined: try the one back soonest"
            clock.advance(500)
            assert pool.current() is a
            pool.mark_failed(a)
            assert a.down_until - clock.monotonic() == 1.0, "the quarantine doubles"
            for _ in range(10):
                pool.mark_failed(a)
            assert a.down_until - clock.monotonic() == MAX_QUARANTINE_S
            pool.mark_ok(a)
            assert a.failures == 0 and a.down_until == 0
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_translate_keeps_the_reason_and_the_cause():
    async def scenario():
        pool = GatewayPool(["a:1"])
        try:
            status = errors.to_status(errors.RecordTooLargeError("too big"))
            rpc_error = _RpcError(grpc.StatusCode.INVALID_ARGUMENT, status.trailing_metadata)
            error = pool.translate(pool.endpoints[0], rpc_error)
            assert isinstance(error, errors.RecordTooLargeError) and error.__cause__ is rpc_error
            assert pool.endpoints[0].failures == 0
            gone = pool.translate(pool.endpoints[0], _RpcError(grpc.StatusCode.UNAVAILABLE))
            assert isinstance(gone, errors.NetworkError) and gone.retriable
            assert pool.endpoints[0].failures == 1
        finally:
            await pool.close()

    asyncio.run(scenario())
