"""The coordinator's instruments (built only when telemetry is on; see
:mod:`services.telemetry.metrics`): controller and partition-availability gauges, consumer lag."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Observation

from services.telemetry import names
from services.telemetry.lag import CONSUMER_LAG, ConsumerLagRegistry
from services.telemetry.metrics import partition_attributes


@dataclass(frozen=True)
class ClusterHealth:
    """What the coordinator's gauges show, computed from its metadata cache at collection time."""

    controller_epoch: int = 0
    live_brokers: int = 0
    #: Partitions by state: ``online``, ``offline``, ``pending``.
    partitions: Mapping[str, int] = field(default_factory=dict)
    under_replicated: int = 0
    #: Online partitions whose ISR is smaller than their topic's min.insync.replicas.
    under_min_isr: int = 0
    #: Partitions being reassigned.
    reassigning: int = 0
    #: Unclean leader elections this coordinator made (records may have been lost).
    unclean_elections: int = 0
    #: Transactional ids, open transactions and the oldest one's age (active controller only).
    transactional_ids: int = 0
    open_transactions: int = 0
    oldest_open_transaction_ms: int = 0


#: How long one computed ClusterHealth serves the gauges of a collection.
_HEALTH_REUSE_S = 0.5


class CoordinatorInstruments:
    """Controller and partition-availability gauges, and the consumer-lag gauge.

    ``is_active()`` says whether this coordinator is the active controller; ``cluster_health()``
    computes a :class:`ClusterHealth` from the metadata cache. Both run on the exporter's thread
    and must only read.
    """

    def __init__(
        self,
        telemetry,
        *,
        coordinator_id: str,
        is_active: Callable[[], bool],
        cluster_health: Callable[[], ClusterHealth],
        consumer_lag: ConsumerLagRegistry = CONSUMER_LAG,
    ) -> None:
        meter = telemetry.meter
        if meter is None:
            return
        self._is_active = is_active
        self._compute_health = cluster_health
        self._health_at = -1.0
        self._health_value = ClusterHealth()
        self._lag = consumer_lag
        identity = {names.ATTR_COORDINATOR_ID: coordinator_id}
        meter.create_observable_gauge(
            names.COORDINATOR_CONTROLLER_ACTIVE,
            [lambda options: [Observation(1 if self._is_active() else 0, identity)]],
            unit="{controller}",
            description="1 on the active controller, 0 on standbys.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_CONTROLLER_EPOCH,
            [lambda options: [Observation(self._health().controller_epoch)]],
            unit="{epoch}",
            description="The controller epoch in the metadata cache.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_BROKERS_LIVE,
            [lambda options: [Observation(self._health().live_brokers)]],
            unit="{node}",
            description="Storage nodes holding a registration lease.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS,
            [self._observe_partitions],
            unit="{partition}",
            description="Partitions by state (online, offline, pending).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_OFFLINE,
            [lambda options: [Observation(self._health().partitions.get("offline", 0))]],
            unit="{partition}",
            description="Partitions without a live leader.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_UNDER_REPLICATED,
            [lambda options: [Observation(self._health().under_replicated)]],
            unit="{partition}",
            description="Partitions with fewer in-sync replicas than replicas.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_UNDER_MIN_ISR,
            [lambda options: [Observation(self._health().under_min_isr)]],
            unit="{partition}",
            description="Partitions whose ISR is smaller than min.insync.replicas (acks=all refused).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_REASSIGNING,
            [lambda options: [Observation(self._health().reassigning)]],
            unit="{partition}",
            description="Partitions being reassigned (new replicas copying, old ones not yet dropped).",
        )
        meter.create_observable_counter(
            names.COORDINATOR_UNCLEAN_ELECTIONS,
            [lambda options: [Observation(self._health().unclean_elections, identity)]],
            unit="{election}",
            description="Leader elections that gave the lead to an out-of-sync replica (data loss).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_TRANSACTIONAL_IDS,
            [lambda options: [Observation(self._health().transactional_ids, identity)]],
            unit="{id}",
            description="Transactional ids the active controller holds (0 on standbys).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_TRANSACTIONS_OPEN,
            [lambda options: [Observation(self._health().open_transactions, identity)]],
            unit="{transaction}",
            description="Transactions open (partitions or offsets added, not yet ended).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_TRANSACTION_OLDEST_AGE,
            [lambda options: [Observation(self._health().oldest_open_transaction_ms, identity)]],
            unit="ms",
            description="Age of the oldest open transaction (read_committed readers wait for it).",
        )
        meter.create_observable_gauge(
            names.CONSUMER_LAG,
            [self._observe_lag],
            unit="{record}",
            description="Log end offset minus committed offset, per group and partition.",
        )

    def _health(self) -> ClusterHealth:
        """Computed once per collection (several gauges read it within milliseconds)."""
        now = time.monotonic()
        if now - self._health_at > _HEALTH_REUSE_S:
            self._health_value = self._compute_health()
            self._health_at = now
        return self._health_value

    def _observe_partitions(self, options: CallbackOptions) -> list[Observation]:
        counts = self._health().partitions
        return [
            Observation(counts.get(state, 0), {names.ATTR_PARTITION_STATE: state})
            for state in ("online", "offline", "pending")
        ]

    def _observe_lag(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(
                lag, {names.MESSAGING_CONSUMER_GROUP_NAME: group, **partition_attributes(topic, partition)}
            )
            for group, topic, partition, lag in self._lag.samples()
        ]
