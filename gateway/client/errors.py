"""The exceptions a client sees: the shared taxonomy, plus two client-side conditions.

Everything the cluster reports is a :class:`~services.errors.TributaryError` subclass carrying
``reason`` (Kafka's name, e.g. ``UNKNOWN_TOPIC_OR_PARTITION``) and ``retriable``; they are
re-exported here so applications import errors from one place::

    from gateway.client.errors import TributaryError, OffsetOutOfRangeError

Client-side timeouts reuse :class:`RequestTimedOutError` (reason ``REQUEST_TIMED_OUT``), as
Kafka's Java client raises its ``TimeoutException`` (the class behind ``REQUEST_TIMED_OUT``) for
a full buffer (``max_block_ms``) and for expired batches (``delivery_timeout_ms``).

The two conditions below are deliberately *not* ``TributaryError`` subclasses: they are mistakes
in how the client is used or configured, never something a server said, and the taxonomy's
reason table is closed (one class per reason, declared in ``services.errors``).
"""

from __future__ import annotations

from services.errors import (  # noqa: F401 -- re-exported
    BrokerNotAvailableError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    LeaderNotAvailableError,
    NetworkError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    TributaryError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_from_rpc,
)


class IllegalStateError(RuntimeError):
    """The client was asked to do something its state does not allow.

    Examples: sending on a closed producer, asking the position of a partition that is not
    assigned, polling with no assignment (Kafka's ``IllegalStateException``).
    """


class NoServersError(ValueError):
    """No gateway address could be found: not passed, not in the environment, no local cluster."""
