"""Synthetic site activity: the page-view events the pipeline, the streaming job and the tests use.

An event is JSON ``{"user": "user-17", "page": "/pricing", "ts": 1700000000000}`` keyed by the
user (so each user's events stay in order on one partition), with the record timestamp equal to
``ts``. Events are spread evenly over the ``span_ms`` before ``end_ms``, as if replaying the last
half hour of a site's traffic, so the loader fills several hours' directories and the audit
several windows.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import NamedTuple

PAGES = ("/", "/pricing", "/docs", "/docs/quickstart", "/blog", "/signup", "/login", "/account")
USERS = 500


class ActivityEvent(NamedTuple):
    key: bytes
    value: bytes
    timestamp: int


def activity_events(count: int, *, end_ms: int, span_ms: int, seed: int = 7) -> Iterator[ActivityEvent]:
    """``count`` events with timestamps rising evenly through ``[end_ms - span_ms, end_ms)``."""
    rng = random.Random(seed)
    start = end_ms - span_ms
    for i in range(count):
        ts = start + (i * span_ms) // max(count, 1)
        user = f"user-{rng.randrange(USERS)}"
        value = json.dumps({"user": user, "page": rng.choice(PAGES), "ts": ts}, separators=(",", ":"))
        yield ActivityEvent(user.encode(), value.encode(), ts)
