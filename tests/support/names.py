"""Names no other test (or earlier run against the same cluster) uses."""

from __future__ import annotations

import uuid


def unique(prefix: str) -> str:
    """``prefix`` with a random suffix: a topic, group or member name for one test."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
