"""The exceptions a client sees: the shared taxonomy, plus two client-side conditions.

Everything the cluster reports is a :class:`~services.errors.TributaryError` subclass carrying
``reason`` (Kafka's name, e.g. ``UNKNOWN_TOPIC_OR_PARTITION``) and ``retriable``; they are
re-exported here so applications import errors from one place::

    from gateway.client.errors import TributaryError, OffsetOutOfRangeError

Client-side timeouts reuse :class:`RequestTimedOutError` (reason ``REQUEST_TIMED_OUT``), as
Kafka's Java client raises its ``TimeoutException`` (the class behind ``REQUEST_TIMED_OUT``) for
a full buffer (``max_block_ms``) and for expired batches (``delivery_timeout_ms``).

The conditions below are deliberately *not* ``TributaryError`` subclasses: they are mistakes in
how the client is used or configured, or the application's own request (``wakeup``), never
something a server said, and the taxonomy's reason table is closed (one class per reason,
declared in ``services.errors``).

Consumer groups surface the taxonomy's group errors: ``UnknownMemberIdError`` (the membership
ended: session timeout, or no ``poll`` within ``max_poll_interval_ms``), ``IllegalGenerationError``
(a commit for a partition that moved to another member), ``FencedInstanceIdError`` (a newer
incarnation of this static member took over: fatal), ``RebalanceInProgressError`` (a commit
while the consumer is between memberships), ``InconsistentGroupProtocolError``,
``InvalidGroupIdError``, ``InvalidSessionTimeoutError``, ``GroupIdNotFoundError`` and
``NonEmptyGroupError`` (admin calls on a group that does not exist / still has members).
"""

from __future__ import annotations

from services.errors import (  # noqa: F401 -- re-exported
    BrokerNotAvailableError,
    CoordinatorNotAvailableError,
    CorruptRecordError,
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidConfigError,
    InvalidGroupIdError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    InvalidTopicError,
    LeaderNotAvailableError,
    NetworkError,
    NonEmptyGroupError,
    NotControllerError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    OffsetMetadataTooLargeError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    TributaryError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_from_rpc,
)


class IllegalStateError(RuntimeError):
    """The client was asked to do something its state does not allow.

    Examples: sending on a closed producer, asking the position of a partition that is not
    assigned, polling with no assignment (Kafka's ``IllegalStateException``).
    """


class TransactionAbortedError(IllegalStateError):
    """The record's transaction was aborted before the record was sent."""


class NoServersError(ValueError):
    """No gateway address could be found: not passed, not in the environment, no local cluster."""


class WakeupError(Exception):
    """``poll()`` was interrupted by ``wakeup()`` (Kafka's ``WakeupException``).

    ``wakeup()`` is the one consumer method that is safe to call from another thread: the poll
    in progress -- or, if none is, the next one -- raises this. Catch it to leave the poll loop,
    then ``close()`` the consumer (which commits and leaves the group).
    """
