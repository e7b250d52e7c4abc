"""Calls to the coordinators: fail-over between the configured ones, redirects to the controller.

Any coordinator serves metadata; admin and group calls must reach the active controller. A standby
answers those with ``NOT_CONTROLLER`` and names the controller in the ``x-tributary-controller``
trailing metadata, so :meth:`CoordinatorPool.call` follows that redirect once. A coordinator that
cannot be reached (UNAVAILABLE, connection refused) makes the pool move on to the next address.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services import errors
from services.grpc_server import INTERNAL_CHANNEL_OPTIONS
from services.proto import coordinator_grpc
from services.tls import ChannelRotation, ClientTls, aio_channel, retire_channels

log = logging.getLogger(__name__)

CONTROLLER_TRAILER = "x-tributary-controller"

#: Reconnect quickly after a peer restarts (gRPC's default backoff grows to two minutes).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = INTERNAL_CHANNEL_OPTIONS

# Codes that say "this coordinator cannot answer now", as opposed to an answer about the request.
_TRY_ANOTHER = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}


def controller_redirect(exc: grpc.aio.AioRpcError) -> str | None:
    """The controller address a NOT_CONTROLLER answer names, if any."""
    for key, value in exc.trailing_metadata() or ():
        if key == CONTROLLER_TRAILER and value:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class CoordinatorPool:
    """One channel per coordinator address; remembers which one answered last.

    Must be used from one event loop.
    """

    def __init__(
        self,
        addresses: list[str],
        *,
        interceptors: Callable[[str], list] | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one coordinator address is needed")
        self._addresses = list(addresses)
        self._current = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: target -> client interceptors for its channel (telemetry), or None.
        self._interceptors = interceptors
        #: Mutual TLS to the coordinators (the gateway's member certificate); None: plaintext.
        self._tls = tls
        self._rotation = ChannelRotation(tls)

    @property
    def current_address(self) -> str:
        return self._addresses[self._current]

    def stub(self, address: str | None = None) -> coordinator_grpc.CoordinatorStub:
        address = address or self.current_address
        if self._rotation.rotated():  # new channels present the new certificate
            retire_channels(self._channels.values())
            self._channels = {}
        channel = self._channels.get(address)
        if channel is None:
            interceptors = self._interceptors(address) if self._interceptors is not None else None
            channel = aio_channel(
                address, self._tls, options=CHANNEL_OPTIONS, interceptors=interceptors or None
            )
            self._channels[address] = channel
        return coordinator_grpc.CoordinatorStub(channel)

    def rotate(self) -> str:
        """Move to the next configured coordinator; returns its address."""
        self._current = (self._current + 1) % len(self._addresses)
        return self.current_address

    async def call(self, method: str, request, *, timeout: float):
        """Call ``Coordinator.<method>`` on a coordinator that answers; typed errors on failure.

        Tries every configured coordinator once (starting with the last one that answered),
        following one NOT_CONTROLLER redirect per attempt; COORDINATOR_NOT_AVAILABLE when none
        could be reached.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        last: errors.TributaryError = errors.RequestTimedOutError("out of time")
        for _ in range(len(self._addresses)):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                return await self._call_following_redirect(self.current_address, method, request, remaining)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _TRY_ANOTHER:
                    raise errors.error_from_rpc(exc) from exc
                last = errors.error_from_rpc(exc)
                log.info(
                    "coordinator %s unavailable for %s (%s); trying the next",
                    self.current_address,
                    method,
                    exc.details(),
                )
                self.rotate()
        raise errors.CoordinatorNotAvailableError(f"no coordinator answered {method}: {last}") from last

    async def _call_following_redirect(self, address: str, method: str, request, timeout: float):
        try:
            return await getattr(self.stub(address), method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            target = controller_redirect(exc)
            if target is None or target == address:
                raise
            log.debug("%s redirected from %s to controller %s", method, address, target)
            return await getattr(self.stub(target), method)(request, timeout=timeout)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)


#: How long to wait before asking again a coordinator that does not serve a stream (an older one).
UNIMPLEMENTED_RETRY_S = 30.0


async def follow_snapshots(
    pool: CoordinatorPool,
    open_stream: Callable[[Any], Any],
    apply: Callable[[Any], Awaitable[None]],
    what: str,
    *,
    retry_s: float = 0.5,
) -> None:
    """Follow a snapshot stream of the coordinators (ACLs, client quotas): ``open_stream(stub)``
    on the current coordinator, ``await apply(snapshot)`` for each answer, and on to the next
    coordinator when the stream breaks. Runs until cancelled."""
    while True:
        address = pool.current_address
        try:
            async for snapshot in open_stream(pool.stub(address)):
                await apply(snapshot)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("coordinator %s serves no %s (an older version?)", address, what)
                await asyncio.sleep(UNIMPLEMENTED_RETRY_S)
            log.info("%s stream from coordinator %s ended (%s); trying the next", what, address, exc.code())
        except errors.TributaryError as exc:
            log.error("%s from coordinator %s cannot be read (%s); trying the next", what, address, exc)
        pool.rotate()
        await asyncio.sleep(retry_s)
