"""Controlled shutdown: before a node stops, the controller moves its partitions elsewhere.

Kafka's ControlledShutdown. On SIGTERM, while the node still serves (gRPC, data port, replica
fetchers), it asks the active controller to move the leadership of every partition it leads to
another in-sync replica and to drop it from the ISRs it is in (``Coordinator.ControlledShutdown``).
The controller bumps each moved partition's leader epoch and tells the replicas, as for any
change of leader: this node becomes a follower (its acks=all appends still waiting fail with
NOT_LEADER_OR_FOLLOWER, which producers retry against the new leader) and the new leaders stop
waiting for it. The node asks again while partitions are left to move or the controller cannot
be reached (``controlled_shutdown_max_retries``), then waits until it has applied the new roles
itself, all within ``controlled_shutdown_timeout_ms``; only then does it stop. Partitions with no
other in-sync replica (replication factor 1, or an ISR of only this node) stay led by it until it
exits, as in Kafka.

Whatever happens -- no controller, a timeout -- the node still stops: this only shortens the
time partitions have no leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol

from services import errors
from services.config import ConfigError

log = logging.getLogger(__name__)

#: The longest one request asks the controller to wait for the moves (the node asks again).
_REQUEST_WAIT_S = 10.0
#: Pause before asking again after a failed request.
_RETRY_BACKOFF_S = 0.5
#: How often the node looks whether it has applied the roles the controller sent.
_ROLES_POLL_S = 0.02


class ShutdownChannel(Protocol):
    async def controlled_shutdown(
        self, broker_epoch: int, wait_s: float
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]: ...


@dataclass(frozen=True, slots=True)
class ShutdownSettings:
    """``controlled_shutdown_*`` of :class:`storage_node.config.StorageNodeConfig`."""

    enable: bool = True
    timeout_ms: int = 30_000
    max_retries: int = 3

    def __post_init__(self) -> None:
        if self.timeout_ms < 0 or self.max_retries < 0:
            raise ConfigError(
                "controlled.shutdown.timeout.ms and controlled.shutdown.max.retries must not be "
                f"negative (got {self.timeout_ms} and {self.max_retries})"
            )


@dataclass(frozen=True, slots=True)
class ShutdownOutcome:
    """How a controlled shutdown ended (for the log and tests)."""

    completed: bool  # nothing left to move, and the node applied the new roles
    attempts: int
    remaining: tuple[tuple[str, int], ...]  # still to move when it gave up
    kept: tuple[tuple[str, int], ...]  # led by this node with no other in-sync replica
    elapsed_s: float


async def controlled_shutdown(
    channel: ShutdownChannel,
    broker_epoch: int,
    leading,
    settings: ShutdownSettings,
    *,
    tracer=None,
) -> ShutdownOutcome:
    """Run one controlled shutdown. ``leading()``: the (topic, partition) this node leads now."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + settings.timeout_ms / 1000.0
    span = (
        tracer.start_as_current_span("storage.controlled_shutdown")
        if tracer is not None
        else contextlib.nullcontext()
    )
    with span as current:
        outcome = await _run(channel, broker_epoch, leading, settings, deadline, started)
        if current is not None:
            current.set_attribute("tributary.shutdown.completed", outcome.completed)
            current.set_attribute("tributary.shutdown.attempts", outcome.attempts)
            current.set_attribute("tributary.shutdown.remaining", len(outcome.remaining))
            current.set_attribute("tributary.shutdown.kept", len(outcome.kept))
    return outcome


async def _run(channel, broker_epoch, leading, settings, deadline, started) -> ShutdownOutcome:
    loop = asyncio.get_running_loop()
    remaining: list[tuple[str, int]] = []
    kept: list[tuple[str, int]] = []
    attempts = 0
    asked = False
    log.info(
        "controlled shutdown: asking the controller to move %d led partitions (up to %d ms)",
        len(leading()),
        settings.timeout_ms,
    )
    while attempts <= settings.max_retries:
        left = deadline - loop.time()
        if left <= 0:
            break
        attempts += 1
        try:
            remaining, kept = await channel.controlled_shutdown(broker_epoch, min(left, _REQUEST_WAIT_S))
            asked = True
        except errors.TributaryError as exc:
            log.warning("controlled shutdown request %d failed: %s", attempts, exc)
            if not exc.retriable:
                break
            await asyncio.sleep(min(_RETRY_BACKOFF_S, max(0.0, deadline - loop.time())))
            continue
        log.info(
            "controlled shutdown request %d: %d partitions left to move, %d kept",
            attempts,
            len(remaining),
            len(kept),
        )
        if not remaining:
            break
    completed = asked and not remaining and await _roles_applied(leading, set(kept), deadline)
    elapsed = loop.time() - started
    if completed:
        log.info(
            "controlled shutdown done in %.2fs: leads only the %d partitions with no other in-sync replica",
            elapsed,
            len(kept),
        )
    else:
        log.warning(
            "controlled shutdown incomplete after %.2fs (%d requests, %d partitions not moved); "
            "stopping anyway",
            elapsed,
            attempts,
            len(remaining),
        )
    return ShutdownOutcome(completed, attempts, tuple(remaining), tuple(kept), elapsed)


async def _roles_applied(leading, kept: set[tuple[str, int]], deadline: float) -> bool:
    """Wait (until ``deadline``) until this node leads nothing but ``kept``: the controller's
    role push reached it, so its pending acks=all appends were answered NOT_LEADER_OR_FOLLOWER."""
    loop = asyncio.get_running_loop()
    while not set(leading()) <= kept:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_ROLES_POLL_S)
    return True
