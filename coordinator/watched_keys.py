"""The decoded values of every etcd key under one prefix, kept by the coordinator's cluster watch.

ACLs (``coordinator/acls.py``) and client quotas (``coordinator/quotas.py``) are both small sets
of JSON values under a prefix that every coordinator follows and streams to gateways: the same
cache serves both. A value that does not decode is logged and left out (never served).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from services.etcd.values import EventType, WatchEvent, WatchResync

log = logging.getLogger(__name__)

T = TypeVar("T")


class WatchedKeys(Generic[T]):
    """Every key under ``prefix`` decoded, as of the cluster watch; ``version`` moves on each
    change, and :meth:`wait_changed` wakes streams that follow it."""

    def __init__(self, prefix: str, decode: Callable[[bytes], T], what: str) -> None:
        self._prefix = prefix
        self._decode = decode
        self._what = what
        #: etcd key -> decoded value.
        self.entries: dict[str, T] = {}
        self.version = 0
        self._changed = asyncio.Condition()

    def apply(self, batch: list[WatchEvent] | WatchResync) -> None:
        """A cluster-watch response (a batch listener of the metadata cache)."""
        before = self.version
        if isinstance(batch, WatchResync):
            self.entries = {}
            for kv in batch.kvs:
                if kv.key.startswith(self._prefix):
                    self._put(kv.key, kv.value)
            self.version += 1
        else:
            for event in batch:
                if not event.kv.key.startswith(self._prefix):
                    continue
                if event.type is EventType.PUT:
                    self._put(event.kv.key, event.kv.value)
                else:
                    self.entries.pop(event.kv.key, None)
                self.version = before + 1
        if self.version != before:
            asyncio.get_running_loop().create_task(self._notify())

    def _put(self, key: str, raw: bytes) -> None:
        try:
            self.entries[key] = self._decode(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ignoring %s key %r with a bad value: %s", self._what, key, exc)
            self.entries.pop(key, None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_changed(self, version: int, timeout: float) -> bool:
        """Wait until the version passes ``version`` (True) or ``timeout`` (False)."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: self.version != version)
            except TimeoutError:
                return False
        return True
