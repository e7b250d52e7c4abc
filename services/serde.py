"""``*_to_proto`` / ``*_from_proto`` pairs for types shared by several services.

Servicers only translate: they decode with these, call a plain handler, and encode the result.
"""

from __future__ import annotations

from services import errors
from services.proto import pb


def error_to_proto(error: errors.TributaryError):
    """The per-partition ``Error`` message for ``error``."""
    return pb.Error(
        reason=error.reason, kafka_code=error.kafka_code, message=error.message, retriable=error.retriable
    )


def error_from_proto(message) -> errors.TributaryError | None:
    """The typed error in a per-partition ``Error`` field, or None when it is unset."""
    if message is None or not message.reason:
        return None
    return errors.make_error(message.reason, message.message)
