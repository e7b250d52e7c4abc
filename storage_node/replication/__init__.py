"""Replication on a storage node: partition roles, followers fetching from leaders, the high
watermark, the ISR and acknowledgements (see ``docs/architecture.md``, replication)."""
