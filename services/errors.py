"""One error taxonomy for every Tributary service and client, named after Kafka's error codes.

Each error class carries four facts, declared once here:

* ``reason``      -- the stable Kafka name (``NOT_LEADER_OR_FOLLOWER``), what clients match on;
* ``kafka_code``  -- Kafka's numeric error code, for people who know Kafka's tables;
* ``grpc_code``   -- the gRPC status a failed call carries;
* ``retriable``   -- whether trying again (after a metadata refresh when ``invalid_metadata``)
  can succeed.

Errors are translated exactly once at each edge:

* servers raise these from domain code; :func:`abort_with_error` (used by the servicer helper in
  ``services.grpc_server``) turns one into a gRPC status with a ``google.rpc.ErrorInfo`` detail;
* clients call :func:`error_from_rpc` to turn an ``RpcError`` back into the typed exception,
  keeping the server's message and chaining the original error.

Three branches are kept apart, as in Kafka: caller bugs are plain ``ValueError``/``TypeError``;
corrupt or illegal *data* is :class:`CorruptRecordError` and friends; broken internal invariants are
``AssertionError``/``RuntimeError`` and surface as ``UNKNOWN_SERVER_ERROR``.

This module imports grpc only for the status-code enum and the two edge helpers; it never imports
generated code, so the pure byte-format modules can depend on it.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

#: ``ErrorInfo.domain`` for every error we attach; clients ignore details from other domains.
ERROR_DOMAIN = "tributary.dev"
_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class TributaryError(Exception):
    """Root of the taxonomy. Subclasses set class attributes (and CorruptRecordError carries
    where the bad batch is)."""

    reason: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    kafka_code: ClassVar[int] = -1
    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.reason}] {self.message}" if self.message else f"[{self.reason}]"


UnknownServerError = TributaryError


class OffsetOutOfRangeError(TributaryError):
    reason, kafka_code, grpc_code = "OFFSET_OUT_OF_RANGE", 1, grpc.StatusCode.OUT_OF_RANGE


class CorruptRecordError(TributaryError):
    """A batch failed structure or CRC validation.

    Kafka marks this retriable because it may be a network fault; here gRPC and the fetch port
    already protect the bytes in transit, so a corrupt batch is the sender's data and sending the
    same bytes again cannot succeed.

    When a consumer meets a stored batch it cannot read, the error also says where it is (as
    Kafka's ``RecordDeserializationException`` carries its partition and offset): ``topic``,
    ``partition``, ``offset`` (the batch's base offset) and ``next_offset`` (the first offset
    after it: seek there to skip it). They are None otherwise.
    """

    reason, kafka_code, grpc_code = "CORRUPT_MESSAGE", 2, grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self,
        message: str = "",
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        next_offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.next_offset = next_offset

    @classmethod
    def unreadable_batch(
        cls, cause: CorruptRecordError, *, topic: str, partition: int, base_offset: int, next_offset: int
    ) -> CorruptRecordError:
        """What a consumer reports for a stored batch it cannot read: which batch, and where to
        continue to skip it (``next_offset``: the offset after the batch, at least one past its
        base even when its header is damaged too). Keeps ``cause`` as the cause."""
        next_offset = max(next_offset, base_offset + 1)
        error = cls(
            f"record batch at offsets {base_offset}..{next_offset - 1} of {topic}-{partition} cannot be "
            f"read ({cause.message}); to skip it, continue from offset {next_offset}",
            topic=topic,
            partition=partition,
            offset=base_offset,
            next_offset=next_offset,
        )
        error.__cause__ = cause
        return error


class UnknownTopicOrPartitionError(TributaryError):
    reason, kafka_code, grpc_code = "UNKNOWN_TOPIC_OR_PARTITION", 3, grpc.StatusCode.NOT_FOUND
    retriable = invalid_metadata = True


class InvalidFetchSizeError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_FETCH_SIZE", 4, grpc.StatusCode.INVALID_ARGUMENT


class LeaderNotAvailableError(TributaryError):
    reason, kafka_code, grpc_code = "LEADER_NOT_AVAILABLE", 5, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class NotLeaderOrFollowerError(TributaryError):
    reason, kafka_code, grpc_code = "NOT_LEADER_OR_FOLLOWER", 6, grpc.StatusCode.FAILED_PRECONDITION
    retriable = invalid_metadata = True


class RequestTimedOutError(TributaryError):
    reason, kafka_code, grpc_code = "REQUEST_TIMED_OUT", 7, grpc.StatusCode.DEADLINE_EXCEEDED
    retriable = True


class BrokerNotAvailableError(TributaryError):
    reason, kafka_code, grpc_code = "BROKER_NOT_AVAILABLE", 8, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class RecordTooLargeError(TributaryError):
    """Kafka's MESSAGE_TOO_LARGE (code 10), under the name its exception class uses."""

    reason, kafka_code, grpc_code = "RECORD_TOO_LARGE", 10, grpc.StatusCode.INVALID_ARGUMENT


class StaleControllerEpochError(TributaryError):
    reason, kafka_code, grpc_code = "STALE_CONTROLLER_EPOCH", 11, grpc.StatusCode.FAILED_PRECONDITION


class OffsetMetadataTooLargeError(TributaryError):
    reason, kafka_code, grpc_code = "OFFSET_METADATA_TOO_LARGE", 12, grpc.StatusCode.INVALID_ARGUMENT


class NetworkError(TributaryError):
    reason, kafka_code, grpc_code = "NETWORK_EXCEPTION", 13, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class CoordinatorNotAvailableError(TributaryError):
    reason, kafka_code, grpc_code = "COORDINATOR_NOT_AVAILABLE", 15, grpc.StatusCode.UNAVAILABLE
    retriable = True


class NotCoordinatorError(TributaryError):
    reason, kafka_code, grpc_code = "NOT_COORDINATOR", 16, grpc.StatusCode.UNAVAILABLE
    retriable = True


class InvalidTopicError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_TOPIC_EXCEPTION", 17, grpc.StatusCode.INVALID_ARGUMENT


class RecordListTooLargeError(TributaryError):
    reason, kafka_code, grpc_code = "RECORD_LIST_TOO_LARGE", 18, grpc.StatusCode.INVALID_ARGUMENT


class NotEnoughReplicasError(TributaryError):
    reason, kafka_code, grpc_code = "NOT_ENOUGH_REPLICAS", 19, grpc.StatusCode.UNAVAILABLE
    retriable = True


class NotEnoughReplicasAfterAppendError(TributaryError):
    reason, kafka_code, grpc_code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 20, grpc.StatusCode.UNAVAILABLE
    retriable = True


class InvalidRequiredAcksError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_REQUIRED_ACKS", 21, grpc.StatusCode.INVALID_ARGUMENT


class IllegalGenerationError(TributaryError):
    reason, kafka_code, grpc_code = "ILLEGAL_GENERATION", 22, grpc.StatusCode.FAILED_PRECONDITION


class InconsistentGroupProtocolError(TributaryError):
    reason, kafka_code, grpc_code = "INCONSISTENT_GROUP_PROTOCOL", 23, grpc.StatusCode.INVALID_ARGUMENT


class InvalidGroupIdError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_GROUP_ID", 24, grpc.StatusCode.INVALID_ARGUMENT


class UnknownMemberIdError(TributaryError):
    reason, kafka_code, grpc_code = "UNKNOWN_MEMBER_ID", 25, grpc.StatusCode.FAILED_PRECONDITION


class InvalidSessionTimeoutError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_SESSION_TIMEOUT", 26, grpc.StatusCode.INVALID_ARGUMENT


class RebalanceInProgressError(TributaryError):
    reason, kafka_code, grpc_code = "REBALANCE_IN_PROGRESS", 27, grpc.StatusCode.ABORTED


class TopicAuthorizationFailedError(TributaryError):
    reason, kafka_code, grpc_code = "TOPIC_AUTHORIZATION_FAILED", 29, grpc.StatusCode.PERMISSION_DENIED


class GroupAuthorizationFailedError(TributaryError):
    reason, kafka_code, grpc_code = "GROUP_AUTHORIZATION_FAILED", 30, grpc.StatusCode.PERMISSION_DENIED


class ClusterAuthorizationFailedError(TributaryError):
    reason, kafka_code, grpc_code = "CLUSTER_AUTHORIZATION_FAILED", 31, grpc.StatusCode.PERMISSION_DENIED


class InvalidTimestampError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_TIMESTAMP", 32, grpc.StatusCode.INVALID_ARGUMENT


class UnsupportedVersionError(TributaryError):
    reason, kafka_code, grpc_code = "UNSUPPORTED_VERSION", 35, grpc.StatusCode.UNIMPLEMENTED


class TopicAlreadyExistsError(TributaryError):
    reason, kafka_code, grpc_code = "TOPIC_ALREADY_EXISTS", 36, grpc.StatusCode.ALREADY_EXISTS


class InvalidPartitionsError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_PARTITIONS", 37, grpc.StatusCode.INVALID_ARGUMENT


class InvalidReplicationFactorError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_REPLICATION_FACTOR", 38, grpc.StatusCode.INVALID_ARGUMENT


class InvalidReplicaAssignmentError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_REPLICA_ASSIGNMENT", 39, grpc.StatusCode.INVALID_ARGUMENT


class InvalidConfigError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_CONFIG", 40, grpc.StatusCode.INVALID_ARGUMENT


class NotControllerError(TributaryError):
    reason, kafka_code, grpc_code = "NOT_CONTROLLER", 41, grpc.StatusCode.UNAVAILABLE
    retriable = True


class InvalidRequestError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_REQUEST", 42, grpc.StatusCode.INVALID_ARGUMENT


class PolicyViolationError(TributaryError):
    reason, kafka_code, grpc_code = "POLICY_VIOLATION", 44, grpc.StatusCode.FAILED_PRECONDITION


class OutOfOrderSequenceNumberError(TributaryError):
    reason, kafka_code, grpc_code = "OUT_OF_ORDER_SEQUENCE_NUMBER", 45, grpc.StatusCode.FAILED_PRECONDITION


class OperationNotAttemptedError(TributaryError):
    """One item of a batched request was not tried because others in it failed (e.g. the valid
    partitions of an AddPartitionsToTxn naming an unknown one): nothing of the request was done."""

    reason, kafka_code, grpc_code = "OPERATION_NOT_ATTEMPTED", 55, grpc.StatusCode.FAILED_PRECONDITION


class KafkaStorageError(TributaryError):
    reason, kafka_code, grpc_code = "KAFKA_STORAGE_ERROR", 56, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class LogDirNotFoundError(TributaryError):
    reason, kafka_code, grpc_code = "LOG_DIR_NOT_FOUND", 57, grpc.StatusCode.NOT_FOUND


class NonEmptyGroupError(TributaryError):
    reason, kafka_code, grpc_code = "NON_EMPTY_GROUP", 68, grpc.StatusCode.FAILED_PRECONDITION


class GroupIdNotFoundError(TributaryError):
    reason, kafka_code, grpc_code = "GROUP_ID_NOT_FOUND", 69, grpc.StatusCode.NOT_FOUND


class FencedLeaderEpochError(TributaryError):
    reason, kafka_code, grpc_code = "FENCED_LEADER_EPOCH", 74, grpc.StatusCode.FAILED_PRECONDITION
    retriable = invalid_metadata = True


class MemberIdRequiredError(TributaryError):
    reason, kafka_code, grpc_code = "MEMBER_ID_REQUIRED", 79, grpc.StatusCode.FAILED_PRECONDITION


class FencedInstanceIdError(TributaryError):
    reason, kafka_code, grpc_code = "FENCED_INSTANCE_ID", 82, grpc.StatusCode.FAILED_PRECONDITION


class InvalidRecordError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_RECORD", 87, grpc.StatusCode.INVALID_ARGUMENT


class ThrottlingQuotaExceededError(TributaryError):
    reason, kafka_code, grpc_code = "THROTTLING_QUOTA_EXCEEDED", 89, grpc.StatusCode.RESOURCE_EXHAUSTED
    retriable = True


class ReplicaNotAvailableError(TributaryError):
    """A replica does not hold the partition's log (lost, or never created)."""

    reason, kafka_code, grpc_code = "REPLICA_NOT_AVAILABLE", 9, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class UnknownLeaderEpochError(TributaryError):
    """The request carries a leader epoch newer than this replica knows (it will learn it)."""

    reason, kafka_code, grpc_code = "UNKNOWN_LEADER_EPOCH", 76, grpc.StatusCode.UNAVAILABLE
    retriable = invalid_metadata = True


class OffsetNotAvailableError(TributaryError):
    reason, kafka_code, grpc_code = "OFFSET_NOT_AVAILABLE", 78, grpc.StatusCode.UNAVAILABLE
    retriable = True


class InvalidUpdateVersionError(TributaryError):
    """An AlterPartition named a partition state version that is no longer current."""

    reason, kafka_code, grpc_code = "INVALID_UPDATE_VERSION", 95, grpc.StatusCode.FAILED_PRECONDITION


class DuplicateSequenceNumberError(TributaryError):
    reason, kafka_code, grpc_code = "DUPLICATE_SEQUENCE_NUMBER", 46, grpc.StatusCode.ALREADY_EXISTS


class InvalidProducerEpochError(TributaryError):
    """A batch of an older epoch of its producer (a zombie, or a producer whose epoch was bumped)."""

    reason, kafka_code, grpc_code = "INVALID_PRODUCER_EPOCH", 47, grpc.StatusCode.FAILED_PRECONDITION


class InvalidTxnStateError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_TXN_STATE", 48, grpc.StatusCode.FAILED_PRECONDITION


class TransactionalIdNotFoundError(TributaryError):
    reason, kafka_code, grpc_code = "TRANSACTIONAL_ID_NOT_FOUND", 105, grpc.StatusCode.NOT_FOUND


class InvalidProducerIdMappingError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_PRODUCER_ID_MAPPING", 49, grpc.StatusCode.FAILED_PRECONDITION


class InvalidTransactionTimeoutError(TributaryError):
    reason, kafka_code, grpc_code = "INVALID_TRANSACTION_TIMEOUT", 50, grpc.StatusCode.INVALID_ARGUMENT


class ConcurrentTransactionsError(TributaryError):
    """The previous transaction of this producer is still being completed: retry shortly."""

    reason, kafka_code, grpc_code = "CONCURRENT_TRANSACTIONS", 51, grpc.StatusCode.UNAVAILABLE
    retriable = True


class TransactionCoordinatorFencedError(TributaryError):
    reason, kafka_code, grpc_code = "TRANSACTION_COORDINATOR_FENCED", 52, grpc.StatusCode.FAILED_PRECONDITION


class UnknownProducerIdError(TributaryError):
    """The partition has no state for this producer (expired, or removed with old segments)."""

    reason, kafka_code, grpc_code = "UNKNOWN_PRODUCER_ID", 59, grpc.StatusCode.FAILED_PRECONDITION


class ProducerFencedError(TributaryError):
    """A newer instance with the same transactional id took over: this one must stop."""

    reason, kafka_code, grpc_code = "PRODUCER_FENCED", 90, grpc.StatusCode.FAILED_PRECONDITION


class StaleBrokerEpochError(TributaryError):
    """A storage node's request names a registration (broker epoch) that is no longer current:
    the node restarted since, so a delayed request of its previous run must do nothing."""

    reason, kafka_code, grpc_code = "STALE_BROKER_EPOCH", 77, grpc.StatusCode.FAILED_PRECONDITION


class PreferredLeaderNotAvailableError(TributaryError):
    """A preferred leader election could not move leadership to the first replica: it is not
    live, not in sync, or stopping. Retriable: it may be in sync later."""

    reason, kafka_code, grpc_code = "PREFERRED_LEADER_NOT_AVAILABLE", 80, grpc.StatusCode.UNAVAILABLE
    retriable = True


class ElectionNotNeededError(TributaryError):
    """A preferred leader election found the first replica leading already."""

    reason, kafka_code, grpc_code = "ELECTION_NOT_NEEDED", 84, grpc.StatusCode.FAILED_PRECONDITION


class ReassignmentInProgressError(TributaryError):
    """A partition reassignment was asked for a partition that is being reassigned already
    (cancel the running one first)."""

    reason, kafka_code, grpc_code = "REASSIGNMENT_IN_PROGRESS", 60, grpc.StatusCode.FAILED_PRECONDITION


class NoReassignmentInProgressError(TributaryError):
    """A cancel named a partition that is not being reassigned."""

    reason, kafka_code, grpc_code = "NO_REASSIGNMENT_IN_PROGRESS", 85, grpc.StatusCode.FAILED_PRECONDITION


class TransactionalIdAuthorizationFailedError(TributaryError):
    reason, kafka_code, grpc_code = (
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        53,
        grpc.StatusCode.PERMISSION_DENIED,
    )


class SaslAuthenticationFailedError(TributaryError):
    """A client's credentials (a bearer token) are missing, malformed, expired or not signed
    with the gateway's key. Not retriable with the same credentials."""

    reason, kafka_code, grpc_code = "SASL_AUTHENTICATION_FAILED", 58, grpc.StatusCode.UNAUTHENTICATED


class FetchSessionIdNotFoundError(TributaryError):
    """An incremental fetch named a fetch session its connection does not have (never opened,
    evicted, or closed by the gateway). Retriable: the client sends a full fetch, as in Kafka's
    KIP-227."""

    reason, kafka_code, grpc_code = "FETCH_SESSION_ID_NOT_FOUND", 70, grpc.StatusCode.NOT_FOUND
    retriable = True


class InvalidFetchSessionEpochError(TributaryError):
    """An incremental fetch carried an epoch other than the one its session expects (a fetch
    lost or given up on), or came while the session had a fetch in flight. Retriable: the client
    sends a full fetch."""

    reason, kafka_code, grpc_code = "INVALID_FETCH_SESSION_EPOCH", 71, grpc.StatusCode.FAILED_PRECONDITION
    retriable = True


class IneligibleReplicaError(TributaryError):
    """An AlterPartition would add a replica that may not join the ISR (not live)."""

    reason, kafka_code, grpc_code = "INELIGIBLE_REPLICA", 107, grpc.StatusCode.FAILED_PRECONDITION


def _all_error_classes() -> list[type[TributaryError]]:
    seen: list[type[TributaryError]] = [TributaryError]
    stack = list(TributaryError.__subclasses__())
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


def _build_reason_table() -> dict[str, type[TributaryError]]:
    table: dict[str, type[TributaryError]] = {}
    for cls in _all_error_classes():
        table.setdefault(cls.reason, cls)
    return table


_BY_REASON = _build_reason_table()


def for_reason(reason: str) -> type[TributaryError]:
    """The error class for a Kafka-style reason; unknown reasons map to the root class."""
    return _BY_REASON.get(reason, TributaryError)


def for_kafka_code(code: int) -> type[TributaryError]:
    """The error class for Kafka's numeric code; unknown codes map to the root class."""
    for cls in _BY_REASON.values():
        if cls.kafka_code == code:
            return cls
    return TributaryError


def make_error(reason: str, message: str = "") -> TributaryError:
    """Build the typed error for ``reason`` (used when decoding per-partition results)."""
    return for_reason(reason)(message)


# ---------------------------------------------------------------------------------------------
# The two edges: server -> status, status -> client exception.
# ---------------------------------------------------------------------------------------------


def to_status(error: TributaryError):
    """A ``grpc.Status`` for ``error`` with a packed ``google.rpc.ErrorInfo`` detail."""
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    info = error_details_pb2.ErrorInfo(
        reason=error.reason,
        domain=ERROR_DOMAIN,
        metadata={"kafka_code": str(error.kafka_code), "retriable": str(error.retriable).lower()},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    code_value = error.grpc_code.value[0]
    assert code_value in code_pb2.Code.values()
    status = status_pb2.Status(code=code_value, message=str(error), details=[detail])
    return rpc_status.to_status(status)


async def abort_with_error(context: grpc.aio.ServicerContext, error: TributaryError) -> None:
    """Abort the current RPC with ``error``'s status and details (raises, never returns)."""
    await context.abort_with_status(to_status(error))


def _reason_from_trailers(trailers) -> tuple[str | None, str | None]:
    from google.rpc import error_details_pb2, status_pb2

    for key, value in trailers or ():
        if key != _STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == ERROR_DOMAIN:
                return info.reason, status.message
    return None, None


_FALLBACK_BY_GRPC = {
    grpc.StatusCode.UNAVAILABLE: NetworkError,
    # A call the server cancelled without answering (a node or gateway shutting down cancels its
    # calls still in flight after the grace period): the request may or may not have been
    # applied, as with a lost connection, so it is a retriable network error, never a failure
    # of the request itself. A caller that cancels its own call sees asyncio.CancelledError.
    grpc.StatusCode.CANCELLED: NetworkError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimedOutError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.UNIMPLEMENTED: UnsupportedVersionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ThrottlingQuotaExceededError,
}


def error_from_rpc(exc: grpc.RpcError) -> TributaryError:
    """The typed error for a failed call, keeping the server's message and the original cause.

    Works for both sync (``grpc.Call``) and asyncio (``grpc.aio.AioRpcError``) errors. A status
    without our ErrorInfo (a proxy, a dead server, a deadline) maps by gRPC code.
    """
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    trailers = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else ()
    reason, message = _reason_from_trailers(trailers)
    if reason is not None:
        cls = for_reason(reason)
        prefix = f"[{reason}] "
        text = message[len(prefix) :] if message and message.startswith(prefix) else (message or "")
        error = cls(text)
    else:
        cls = _FALLBACK_BY_GRPC.get(code, TributaryError)
        error = cls(f"{code.name if code else 'UNKNOWN'}: {details}")
    error.__cause__ = exc
    return error
