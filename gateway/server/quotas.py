"""Client quotas at the gateway: Kafka's byte-rate quotas (KIP-13), request-time quotas (KIP-124)
and their throttling (KIP-219).

* **Which quota applies.** The coordinators stream every quota entity (``WatchClientQuotas``;
  :func:`follow_quotas` keeps :class:`ClientQuotas` on it, so a change applies at once, without
  reconnecting). For a client -- its user, the principal's name (``alice`` for ``User:alice``,
  ``ANONYMOUS`` without a certificate), and its client id (``tributary-client-id`` metadata, or
  the data listener's handshake) -- :class:`~services.quotas.QuotaResolver` picks per key the
  entity that applies, in Kafka's order. A client no quota applies to costs one dict lookup per
  request and is never metered.
* **Metering.** One :class:`QuotaSensor` per metered allowance (the resolver's sensor key: a
  quota on ``user alice`` is one allowance for all of alice's clients, one on ``client-id
  <default>`` one per client id), a :class:`~services.sampled_rate.SampledRate` over
  ``quota_window_num`` windows of ``quota_window_size_seconds``. A produce counts its request's
  size, a fetch the record bytes its answer carries, and under ``request_percentage`` each of
  them also counts the event-loop time it took (:mod:`gateway.server.loop_time`), as percent of
  the loop over the window (100 = all of it).
* **Throttling.** A request that takes its client over a quota is served in full, never
  refused. Its answer carries ``throttle_time_ms``, the time that brings the client's rate back
  to its quota, and the gateway holds the client that long: a data connection or a
  ProduceStream reads no further request until then (Kafka mutes the channel), and unary calls
  of the same allowance wait that long before they are served. A client that honours
  ``throttle_time_ms`` (the SDK does) waits before sending, so it is never held on top. Holding
  is a timer on the event loop: no other client waits for it.

Where the gateway's rate model departs from Kafka's, and why, is in :mod:`services.sampled_rate`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    QuotaResolver,
    SensorKey,
    user_of,
)
from services.sampled_rate import SampledRate

log = logging.getLogger(__name__)

#: Clients whose resolved quotas are remembered (the memory starts over past it).
MAX_REMEMBERED_CLIENTS = 10_000
#: Sensors kept before idle ones are dropped at once (else every few windows).
MAX_SENSORS = 100_000
#: Percent of the loop per second of its time (KIP-124 meters percent of a thread).
_PERCENT_PER_SECOND = 100.0


@dataclass(frozen=True, slots=True)
class QuotaWindows:
    """The metering windows (Kafka's ``quota.window.num`` and ``quota.window.size.seconds``)."""

    samples: int = 11
    window_s: float = 1.0

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"quota_window_num must be at least 2, not {self.samples}")
        if self.window_s <= 0:
            raise ValueError(f"quota_window_size_seconds must be positive, not {self.window_s}")


class QuotaSensor:
    """One metered allowance: its bound, its rate, and until when its clients are held."""

    __slots__ = ("key", "limit", "muted_until", "quota_key", "rate")

    def __init__(self, quota_key: str, key: SensorKey, limit: float, windows: QuotaWindows) -> None:
        self.quota_key = quota_key
        self.key = key
        self.limit = limit
        self.rate = SampledRate(windows.samples, windows.window_s)
        #: Unary calls of this allowance wait until then (clock time, seconds).
        self.muted_until = 0.0

    def record(self, value: float, now: float, max_throttle_s: float | None = None) -> float:
        """Count ``value``; the seconds to hold the client (0 within the quota)."""
        self.rate.record(value, now)
        throttle = self.rate.throttle_s(self.limit, now)
        if max_throttle_s is not None:
            throttle = min(throttle, max_throttle_s)
        if throttle > 0:
            self.muted_until = max(self.muted_until, now + throttle)
        return throttle


class ClientQuota:
    """The sensors that meter one client (user, client id), None for keys without a quota."""

    __slots__ = ("_quotas", "client_id", "fetch", "produce", "request", "user")

    def __init__(
        self,
        quotas: ClientQuotas,
        user: str,
        client_id: str,
        produce: QuotaSensor | None,
        fetch: QuotaSensor | None,
        request: QuotaSensor | None,
    ) -> None:
        self._quotas = quotas
        self.user = user
        self.client_id = client_id
        self.produce = produce
        self.fetch = fetch
        self.request = request

    @property
    def times_requests(self) -> bool:
        """True when the client's requests' loop time is metered (``request_percentage``)."""
        return self.request is not None

    def muted_until(self, byte_sensor: QuotaSensor | None) -> float:
        """Until when unary calls metered by ``byte_sensor`` (and the request time) are held."""
        until = byte_sensor.muted_until if byte_sensor is not None else 0.0
        if self.request is not None:
            until = max(until, self.request.muted_until)
        return until

    def held_ms(self, byte_sensor: QuotaSensor | None) -> int:
        """How long from now unary calls metered by ``byte_sensor`` are held, in ms (what a unary
        answer's ``throttle_time_ms`` says)."""
        return _ms(self.muted_until(byte_sensor) - self._quotas.clock())

    async def wait_unmuted(self, byte_sensor: QuotaSensor | None) -> None:
        """Hold a unary call while its allowance is throttled (a timer: nothing else waits)."""
        delay = self.muted_until(byte_sensor) - self._quotas.clock()
        if delay > 0:
            await asyncio.sleep(delay)

    def record_produce_bytes(self, nbytes: int) -> int:
        """Count a produce request's size (when it is read); the ms to hold the client."""
        return self._record(self.produce, nbytes)

    def record_fetch_bytes(self, nbytes: int) -> int:
        """Count the bytes of a fetch answer (when it is ready); the ms to hold the client."""
        return self._record(self.fetch, nbytes)

    def record_loop_time(self, loop_s: float) -> int:
        """Count the loop time a request took (when it is answered); the ms to hold the client.
        KIP-124 bounds a request-time throttle by one window."""
        if self.request is None:
            return 0
        return self._record(self.request, loop_s * _PERCENT_PER_SECOND, self._quotas.windows.window_s)

    def _record(self, sensor: QuotaSensor | None, value: float, max_throttle_s: float | None = None) -> int:
        if sensor is None or value <= 0:
            return 0
        throttle = sensor.record(value, self._quotas.clock(), max_throttle_s)
        if throttle > 0:
            self._quotas.throttled(sensor, throttle)
        return _ms(throttle)

    def fetch_max_bytes(self, requested: int) -> int:
        """A fetch's ``max_bytes`` bounded by one window's worth of the consumer quota, so one
        answer cannot carry many seconds of it at once (Kafka bounds it by the whole window);
        the first batch still comes whole."""
        if self.fetch is None:
            return requested
        return min(requested, max(1, int(self.fetch.limit * self._quotas.windows.window_s)))


class ClientQuotas:
    """Every client's quotas and meters at this gateway (see the module docstring)."""

    def __init__(
        self,
        windows: QuotaWindows | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_throttle: Callable[[QuotaSensor, float], None] | None = None,
    ) -> None:
        self.windows = windows if windows is not None else QuotaWindows()
        self.clock = clock
        #: Told of every throttled answer (the gateway's telemetry), else None.
        self.on_throttle = on_throttle
        self._resolver = QuotaResolver()
        #: (principal, client id) -> its quota, None when none applies.
        self._clients: dict[tuple[str, str], ClientQuota | None] = {}
        #: (quota key, sensor key) -> sensor; kept across configuration changes (the rate must
        #: not start over when a quota is changed), dropped once idle.
        self.sensors: dict[tuple[str, SensorKey], QuotaSensor] = {}
        self._last_sweep = clock()
        #: Times the quotas were replaced (from the coordinators' stream).
        self.version = 0

    def throttled(self, sensor: QuotaSensor, seconds: float) -> None:
        if self.on_throttle is not None:
            self.on_throttle(sensor, seconds)

    def update(self, entries: Iterable[tuple[QuotaEntity, dict[str, float]]]) -> None:
        """Every quota entity of the cluster, as now (replaces what was known)."""
        self._resolver = QuotaResolver(dict(entries))
        self._clients = {}
        self.version += 1

    @property
    def configured(self) -> bool:
        """True when some quota exists (else every client is let through unmetered)."""
        return bool(self._resolver.keys_in_use)

    def client(self, principal: str, client_id: str) -> ClientQuota | None:
        """The quotas of a client, None when no quota applies to it (the common, cheap case)."""
        if not self._resolver.keys_in_use:
            return None
        remembered = self._clients.get((principal, client_id), _UNKNOWN)
        if remembered is not _UNKNOWN:
            return remembered  # type: ignore[return-value]  # ClientQuota | None
        quota = self._resolve(principal, client_id)
        if len(self._clients) >= MAX_REMEMBERED_CLIENTS:
            self._clients.clear()
        self._clients[(principal, client_id)] = quota
        return quota

    def _resolve(self, principal: str, client_id: str) -> ClientQuota | None:
        user = user_of(principal)
        sensors = [
            self._sensor(key, user, client_id)
            for key in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
        ]
        if all(sensor is None for sensor in sensors):
            return None
        return ClientQuota(self, user, client_id, *sensors)

    def _sensor(self, quota_key: str, user: str, client_id: str) -> QuotaSensor | None:
        resolved = self._resolver.resolve(quota_key, user, client_id)
        if resolved is None:
            return None
        self._maybe_sweep()
        sensor = self.sensors.get((quota_key, resolved.sensor))
        if sensor is None:
            sensor = QuotaSensor(quota_key, resolved.sensor, resolved.limit, self.windows)
            self.sensors[(quota_key, resolved.sensor)] = sensor
        sensor.limit = resolved.limit
        return sensor

    def _maybe_sweep(self) -> None:
        """Drop sensors whose windows are empty (their rate is 0, nothing is lost): every
        ``quota_window_num`` windows, or every window while there are too many (never more
        often: a sweep looks at every sensor)."""
        now = self.clock()
        since = now - self._last_sweep
        every = (
            self.windows.window_s
            if len(self.sensors) >= MAX_SENSORS
            else self.windows.samples * self.windows.window_s
        )
        if since < every:
            return
        self._last_sweep = now
        idle = [
            key for key, sensor in self.sensors.items() if sensor.rate.idle(now) and sensor.muted_until < now
        ]
        for key in idle:
            del self.sensors[key]
        if idle:
            # Remembered clients may hold dropped sensors: resolve them again.
            self._clients = {}


_UNKNOWN = object()


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000.0 + 0.5))


class ChannelThrottle:
    """Until when one channel (a data connection, a ProduceStream) is held (KIP-219's mute)."""

    __slots__ = ("clock", "muted_until")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.muted_until = 0.0

    def hold(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self.muted_until = max(self.muted_until, self.clock() + throttle_ms / 1000.0)

    def remaining_ms(self) -> int:
        """How long from now the channel is held (what its next answer's throttle_time_ms says)."""
        return _ms(self.muted_until - self.clock())

    async def wait(self) -> None:
        """Return once the channel may be read again (at once when it is not held)."""
        delay = self.muted_until - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)


async def follow_quotas(pool, quotas: ClientQuotas) -> None:
    """Keep ``quotas`` on the coordinators' quota entities (``WatchClientQuotas``). Runs until
    cancelled. Until the first snapshot arrives no client is metered (quotas limit use; they are
    not access control)."""
    from gateway.server.coordinators import follow_snapshots
    from services.proto import pb
    from services.serde import quota_entry_from_proto

    async def apply(snapshot) -> None:
        quotas.update([quota_entry_from_proto(entry) for entry in snapshot.entries])

    await follow_snapshots(
        pool, lambda stub: stub.WatchClientQuotas(pb.WatchClientQuotasRequest()), apply, "client quotas"
    )
