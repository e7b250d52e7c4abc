"""Standby behaviour for admin calls: forward them to the active controller, or name it.

A handler on a coordinator that is not the active controller raises
:class:`ControllerMovedError` (a ``NOT_CONTROLLER``) carrying the active one's id and address
as this coordinator's cache knows them. The servicer then forwards the original request there,
once (the forwarded call is marked with :data:`FORWARDED_HEADER`, so a coordinator that is not
active either answers NOT_CONTROLLER instead of forwarding again). If forwarding is impossible
(no active controller, or it does not answer), the caller gets NOT_CONTROLLER naming the active
controller in the message and in the :data:`CONTROLLER_TRAILER` trailing metadata.
"""

from __future__ import annotations

import logging

import grpc
import grpc.aio

from services import errors
from services.grpc_server import INTERNAL_CHANNEL_OPTIONS
from services.proto import coordinator_grpc
from services.tls import ChannelRotation, ClientTls, aio_channel, retire_channels

log = logging.getLogger(__name__)

#: Trailing metadata naming the active controller (host:port) on NOT_CONTROLLER answers.
CONTROLLER_TRAILER = "x-tributary-controller"
#: Request metadata marking a call one coordinator forwarded to another.
FORWARDED_HEADER = "x-tributary-forwarded-by"
#: gRPC codes that mean "the target did not answer", as opposed to an answer that is an error.
_NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class ControllerMovedError(errors.NotControllerError):
    """This coordinator is not the active controller; ``active_address`` is, when known."""

    def __init__(self, message: str, *, active_id: str = "", active_address: str = "") -> None:
        super().__init__(message)
        self.active_id = active_id
        self.active_address = active_address


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


def not_controller_status(error: ControllerMovedError) -> grpc.Status:
    """The NOT_CONTROLLER status for ``error``: ErrorInfo detail plus the controller trailer."""
    status = errors.to_status(error)
    trailer = ((CONTROLLER_TRAILER, error.active_address),) if error.active_address else ()
    return _Status(status.code, status.details, tuple(status.trailing_metadata) + trailer)


def was_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED_HEADER for key, _ in context.invocation_metadata() or ())


class Forwarder:
    """Sends admin requests on to the active controller over a cached channel per address."""

    def __init__(self, coordinator_id: str, *, timeout: float = 10.0, tls: ClientTls | None = None) -> None:
        self.coordinator_id = coordinator_id
        #: Mutual TLS to the other coordinators (this one's member certificate); None: plaintext.
        self._tls = tls
        self._rotation = ChannelRotation(tls)
        self.timeout = timeout
        self._stubs: dict[str, tuple[grpc.aio.Channel, coordinator_grpc.CoordinatorStub]] = {}

    def _stub(self, address: str) -> coordinator_grpc.CoordinatorStub:
        if self._rotation.rotated():  # new channels present the new certificate
            retire_channels(channel for channel, _ in self._stubs.values())
            self._stubs = {}
        entry = self._stubs.get(address)
        if entry is None:
            channel = aio_channel(address, self._tls, options=INTERNAL_CHANNEL_OPTIONS)
            entry = (channel, coordinator_grpc.CoordinatorStub(channel))
            self._stubs[address] = entry
        return entry[1]

    async def forward(
        self, moved: ControllerMovedError, method: str, request, context: grpc.aio.ServicerContext
    ):
        """The active controller's answer to ``request``; its errors are passed through as they are.

        Aborts with NOT_CONTROLLER (naming the active controller) when there is none to forward
        to, when the call was itself forwarded, or when the active one does not answer.
        """
        if not moved.active_address or was_forwarded(context):
            await context.abort_with_status(not_controller_status(moved))
        timeout = self.timeout
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(0.0, remaining - 0.05))
        try:
            return await getattr(self._stub(moved.active_address), method)(
                request, timeout=timeout, metadata=((FORWARDED_HEADER, self.coordinator_id),)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _NO_ANSWER and not _has_error_info(exc):
                log.info("forwarding %s to %s failed: %s", method, moved.active_address, exc.details())
                await context.abort_with_status(not_controller_status(moved))
            await context.abort(exc.code(), exc.details() or "", trailing_metadata=_passable(exc))

    async def close(self) -> None:
        entries, self._stubs = list(self._stubs.values()), {}
        for channel, _ in entries:
            await channel.close()


def _has_error_info(exc: grpc.aio.AioRpcError) -> bool:
    return any(key == "grpc-status-details-bin" for key, _ in exc.trailing_metadata() or ())


def _passable(exc: grpc.aio.AioRpcError) -> tuple:
    """The answer's trailing metadata that may be set again on our own answer."""
    return tuple(
        (k, v)
        for k, v in (exc.trailing_metadata() or ())
        if not k.startswith("grpc-") or k == "grpc-status-details-bin"
    )
