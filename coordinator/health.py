"""Is etcd reachable right now? A periodic probe, so calls can fail fast with UNAVAILABLE.

The etcd layer's watch reconnects silently, so the metadata cache cannot tell by itself that it
has gone stale. While the probe fails, the coordinator answers every call with
COORDINATOR_NOT_AVAILABLE (UNAVAILABLE, retriable) rather than serve metadata it cannot vouch for
or make a client wait for an etcd deadline; the process keeps running and recovers by itself when
the probe succeeds again.
"""

from __future__ import annotations

import asyncio
import logging

from services import errors
from services.etcd.exceptions import EtcdError

log = logging.getLogger(__name__)


class EtcdHealth:
    """The outcome of the last etcd status probe (``Maintenance.Status`` on the current endpoint)."""

    def __init__(self, client, *, interval: float = 0.5, timeout: float = 1.0) -> None:
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.healthy = False
        self.problem = "not probed yet"

    def ensure_available(self) -> None:
        """Raise COORDINATOR_NOT_AVAILABLE unless the last probe succeeded."""
        if not self.healthy:
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {self.problem}")

    async def probe_once(self) -> bool:
        """Probe now; update and return :attr:`healthy`."""
        try:
            async with asyncio.timeout(self.timeout):
                status = await self.client.status()
            problem = "" if status.has_leader else "the etcd member has no raft leader"
        except (EtcdError, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        self._record(problem)
        return self.healthy

    def _record(self, problem: str) -> None:
        healthy = not problem
        if healthy != self.healthy:
            if healthy:
                log.info("etcd is reachable again")
            else:
                log.warning("etcd is unavailable: %s", problem)
        self.healthy, self.problem = healthy, problem

    async def probe_routine(self) -> None:
        """Probe every ``interval`` seconds, forever."""
        while True:
            await self.probe_once()
            await asyncio.sleep(self.interval)
