"""Validation of group requests (Kafka's rules where it has them). Pure."""

from __future__ import annotations

from services import errors

#: Longest group id accepted (etcd keys stay short; Kafka has no limit but 249 matches topics).
MAX_GROUP_ID_LENGTH = 249


def ensure_valid_group_id(group_id: str) -> None:
    """INVALID_GROUP_ID for an empty id, one with '/' (it is a path segment of the group's etcd
    keys) or one longer than :data:`MAX_GROUP_ID_LENGTH`."""
    if not group_id:
        raise errors.InvalidGroupIdError("the group id must not be empty")
    if "/" in group_id:
        raise errors.InvalidGroupIdError(f"group id {group_id!r} contains '/'")
    if len(group_id) > MAX_GROUP_ID_LENGTH:
        raise errors.InvalidGroupIdError(f"group id is longer than {MAX_GROUP_ID_LENGTH} characters")


def ensure_valid_session_timeout(timeout_ms: int, minimum_ms: int, maximum_ms: int) -> None:
    """INVALID_SESSION_TIMEOUT outside the coordinator's [group.min, group.max].session.timeout.ms."""
    if not minimum_ms <= timeout_ms <= maximum_ms:
        raise errors.InvalidSessionTimeoutError(
            f"session timeout {timeout_ms} ms is outside [{minimum_ms}, {maximum_ms}] ms "
            "(group.min.session.timeout.ms, group.max.session.timeout.ms)"
        )


def ensure_valid_poll_interval(interval_ms: int) -> None:
    if interval_ms <= 0:
        raise errors.InvalidRequestError(f"max_poll_interval_ms must be positive, got {interval_ms}")


def lease_ttl_s(session_timeout_ms: int) -> int:
    """The etcd lease TTL for a session: whole seconds, rounded up (etcd counts in seconds)."""
    return max(1, -(-session_timeout_ms // 1000))
