"""Honouring a gateway's throttle (Kafka's KIP-219 on the client side).

A gateway that finds a client over one of its quotas serves the request and says in the answer
for how long it will hold the client's next requests (``throttle_time_ms``). The client then
sends nothing to that gateway for as long, as Kafka's clients do: the requests would only wait
at the gateway, counting against their timeouts, and a client that keeps sending through a
throttle is held again for what it sent. :class:`ClientThrottle` keeps that deadline per gateway
address, and counts what it was told for the producer's and consumer's ``metrics()``
(``produce-throttle-time-avg`` / ``-max``, ``fetch-throttle-time-avg`` / ``-max``, in ms over
every answer, as Kafka's clients name them) and, with OpenTelemetry configured, the
``tributary.client.throttle.time`` histogram.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from services.telemetry import ClientInstruments, client_instruments


class ClientThrottle:
    """Until when requests of one kind (``produce`` or ``fetch``) to one gateway wait."""

    __slots__ = (
        "_instruments",
        "_monotonic",
        "answers",
        "max_ms",
        "operation",
        "throttled",
        "total_ms",
        "until",
    )

    def __init__(
        self, operation: str, address: str = "", *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.operation = operation
        self._monotonic = monotonic
        self._instruments: ClientInstruments | None = client_instruments(address)
        #: Monotonic time before which no request goes out (0: none held).
        self.until = 0.0
        #: Answers seen, answers that carried a throttle, and their throttle times in ms.
        self.answers = 0
        self.throttled = 0
        self.total_ms = 0
        self.max_ms = 0

    def remaining_s(self) -> float:
        return max(0.0, self.until - self._monotonic())

    async def wait(self) -> None:
        """Return once the gateway no longer holds this client (at once when it does not)."""
        delay = self.until - self._monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def observe(self, throttle_time_ms: int) -> None:
        """An answer from the gateway, with its ``throttle_time_ms`` (0: not throttled)."""
        self.answers += 1
        if throttle_time_ms <= 0:
            return
        self.throttled += 1
        self.total_ms += throttle_time_ms
        self.max_ms = max(self.max_ms, throttle_time_ms)
        self.until = max(self.until, self._monotonic() + throttle_time_ms / 1000.0)
        if self._instruments is not None:
            self._instruments.throttled(throttle_time_ms / 1000.0, operation=self.operation)


class Throttles:
    """A client's :class:`ClientThrottle` per gateway address, and their totals for ``metrics()``."""

    def __init__(self, operation: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.operation = operation
        self._monotonic = monotonic
        self._by_address: dict[str, ClientThrottle] = {}

    def of(self, address: str) -> ClientThrottle:
        throttle = self._by_address.get(address)
        if throttle is None:
            throttle = self._by_address[address] = ClientThrottle(
                self.operation, address, monotonic=self._monotonic
            )
        return throttle

    def metrics(self) -> dict[str, float]:
        """Kafka's ``<op>-throttle-time-avg`` / ``-max`` (ms, over every answer), plus the
        throttled answers and their total (``<op>-throttled-requests``, ``-throttle-time-total``)."""
        throttles = list(self._by_address.values())
        answers = sum(t.answers for t in throttles)
        total = sum(t.total_ms for t in throttles)
        op = self.operation
        return {
            f"{op}-throttle-time-avg": total / answers if answers else 0.0,
            f"{op}-throttle-time-max": max((t.max_ms for t in throttles), default=0),
            f"{op}-throttle-time-total": total,
            f"{op}-throttled-requests": sum(t.throttled for t in throttles),
        }
