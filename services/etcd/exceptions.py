"""Errors raised by :mod:`services.etcd`, and the one place where gRPC errors become them.

:func:`translate_rpc_error` maps a failed etcd call once, by gRPC status code (refined by etcd's
message where one code covers several cases), keeps the server's message and the endpoint, and
callers raise the result ``from`` the original ``grpc.aio.AioRpcError``.

These errors are not part of the Kafka-named taxonomy in :mod:`services.errors` on purpose: they
never cross Tributary's own wire. A service translates them at its edge, e.g. the coordinator
answers :class:`EtcdUnavailableError` with ``COORDINATOR_NOT_AVAILABLE`` and
:class:`EtcdGuardFailedError` (its controller epoch moved on) with ``NOT_CONTROLLER``.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

# etcd's own messages, used where one status code covers cases callers must tell apart.
_COMPACTED = "required revision has been compacted"
_FUTURE_REVISION = "required revision is a future revision"
_LEASE_NOT_FOUND = "requested lease not found"
#: etcd's refusal of a request over --max-request-bytes (INVALID_ARGUMENT), and gRPC's of a
#: message over etcd's receive limit (that plus 512 KiB; RESOURCE_EXHAUSTED).
_TOO_LARGE = ("request is too large", "larger than max")


class EtcdError(Exception):
    """Root of the etcd errors. ``code`` is the gRPC status of the failed call, when there was one."""

    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class EtcdUnavailableError(EtcdError):
    """No endpoint answered in time: connection refused or lost, no leader, deadline exceeded.

    Retriable: a later call (maybe to another endpoint) may succeed. A write that failed this way
    may or may not have been applied.
    """

    retriable = True


class EtcdClosedError(EtcdError):
    """The client was closed; nothing more can be sent through it."""


class EtcdCompactedError(EtcdError):
    """The requested revision has been compacted away (history before it is gone)."""

    def __init__(
        self, message: str = "", *, code: grpc.StatusCode | None = None, compact_revision: int = 0
    ) -> None:
        super().__init__(message, code=code)
        self.compact_revision = compact_revision


class EtcdFutureRevisionError(EtcdError):
    """The requested revision is newer than the store's current revision."""


class EtcdLeaseNotFoundError(EtcdError):
    """The lease does not exist (it expired or was revoked)."""


class EtcdInvalidArgumentError(EtcdError):
    """etcd rejected the request itself (e.g. the same key twice in one txn, too many txn ops)."""


class EtcdRequestTooLargeError(EtcdInvalidArgumentError):
    """The request is larger than etcd accepts (``--max-request-bytes``, 1.5 MiB by default).

    Not retriable, although gRPC reports the larger ones as RESOURCE_EXHAUSTED: the same request
    is refused every time.
    """


class EtcdPermissionDeniedError(EtcdError):
    """Authentication or authorisation failed."""


class EtcdResourceExhaustedError(EtcdError):
    """etcd is overloaded ("too many requests") or out of space (NOSPACE alarm)."""

    retriable = True


class EtcdGuardFailedError(EtcdError):
    """A guarded write was not applied because one of its guard compares was false.

    The coordinator guards every metadata write with "the controller epoch is still mine"; this
    error means another controller has taken over.
    """


class NotLeaderError(EtcdError):
    """An operation that needs election leadership was attempted without (or after losing) it."""


_BY_CODE: dict[grpc.StatusCode, type[EtcdError]] = {
    grpc.StatusCode.UNAVAILABLE: EtcdUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: EtcdUnavailableError,
    grpc.StatusCode.NOT_FOUND: EtcdLeaseNotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: EtcdInvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: EtcdInvalidArgumentError,
    grpc.StatusCode.PERMISSION_DENIED: EtcdPermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: EtcdPermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: EtcdResourceExhaustedError,
}


def error_class_for(code: grpc.StatusCode, details: str) -> type[EtcdError]:
    """The error class for a failed call's status code and etcd's message."""
    if code == grpc.StatusCode.OUT_OF_RANGE:
        if _FUTURE_REVISION in details:
            return EtcdFutureRevisionError
        return EtcdCompactedError
    if code == grpc.StatusCode.NOT_FOUND and _LEASE_NOT_FOUND not in details:
        return EtcdError
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED) and any(
        marker in details for marker in _TOO_LARGE
    ):
        return EtcdRequestTooLargeError
    return _BY_CODE.get(code, EtcdError)


def translate_rpc_error(error: grpc.RpcError, endpoint: str | None = None) -> EtcdError:
    """The :class:`EtcdError` for a failed call; raise it ``from error`` to keep the cause."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(error)
    where = f" (etcd endpoint {endpoint})" if endpoint else ""
    return error_class_for(code, details)(f"{code.name}: {details}{where}", code=code)
