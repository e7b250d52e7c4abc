"""How a storage node shares its file descriptors between the fetch port and the log.

Every fetch-port connection is a descriptor, and while it sends a response it opens one more on
the segment file. Unbounded, ~21,000 idle connections once took every descriptor a node had, and
then gRPC connections, partition creation and segment rolls failed. So the fetch port gets a
fixed share and the rest is kept for the log (segment and index files), gRPC and etcd:

* at start the soft ``RLIMIT_NOFILE`` is raised to the hard limit where allowed
  (:func:`raise_descriptor_limit`, as Kafka's packaging asks operators to raise ``ulimit -n``);
* **the rule**: fetch connections may use at most half of the limit, at two descriptors each, so
  ``fetch.max.connections`` defaults to ``limit // 4``, and the other half of the descriptors is
  the reserve -- which must also hold ``max.open.segments`` (the segment handle cache) plus
  :data:`MIN_OTHER_DESCRIPTORS` for index files, gRPC, etcd and logs;
* a ``fetch.max.connections`` set explicitly is honoured only if it fits that rule; otherwise the
  node refuses to start (ConfigError), rather than promise connections it cannot open.

Pure arithmetic apart from the two ``resource`` calls.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from services.config import ConfigError

log = logging.getLogger(__name__)

#: Descriptors one fetch connection may hold: its socket, and a segment file while it sends.
DESCRIPTORS_PER_FETCH_CONNECTION = 2
#: Kept for everything but segment handles and fetch connections: active segments' index files,
#: gRPC connections, etcd, the process's own files.
MIN_OTHER_DESCRIPTORS = 256


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit when allowed; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return current_descriptor_limit()


def current_descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def resolve_max_open_segments(configured: int, limit: int) -> int:
    """``max.open.segments`` as configured, or for 0 a quarter of the descriptor limit: the fetch
    port may take half, the segment handles a quarter, and a quarter stays for everything else
    (sockets, gRPC, etcd, checkpoints being written). Kafka keeps every segment open and asks
    for a high limit; a bounded LRU sized from the limit keeps the descriptors bounded while a
    raised limit (the node raises its soft limit to the hard one) lets every busy partition keep
    its active segment open."""
    if configured < 0:
        raise ConfigError(f"max.open.segments must not be negative, got {configured}")
    return configured or max(1, limit // 4)


@dataclass(frozen=True, slots=True)
class DescriptorBudget:
    """The descriptor limit and the fetch port's share of it."""

    limit: int
    #: Most fetch-port connections open at once.
    fetch_connections: int
    #: Descriptors never used by the fetch port: ``limit - 2 * fetch_connections``.
    reserved: int

    @classmethod
    def plan(cls, limit: int, *, max_open_segments: int, fetch_max_connections: int = 0) -> DescriptorBudget:
        """The budget for ``limit`` descriptors (the rule is in the module docstring).

        ``fetch_max_connections`` 0 = as many as the rule allows. Raises ConfigError when the
        limit cannot hold the segment cache and the other descriptors, or when an explicit
        ``fetch_max_connections`` does not fit.
        """
        if fetch_max_connections < 0:
            raise ConfigError(f"fetch.max.connections must not be negative, got {fetch_max_connections}")
        others = max_open_segments + MIN_OTHER_DESCRIPTORS
        allowed = min(limit // 2, limit - others) // DESCRIPTORS_PER_FETCH_CONNECTION
        if allowed < 1:
            raise ConfigError(
                f"the descriptor limit ({limit}, ulimit -n) cannot hold max.open.segments "
                f"({max_open_segments}) plus {MIN_OTHER_DESCRIPTORS} other descriptors and any fetch "
                f"connection: raise the limit or lower max.open.segments"
            )
        connections = fetch_max_connections or allowed
        if connections > allowed:
            raise ConfigError(
                f"fetch.max.connections={fetch_max_connections} does not fit the descriptor limit "
                f"({limit}, ulimit -n): at {DESCRIPTORS_PER_FETCH_CONNECTION} descriptors each, at most "
                f"{allowed} leave half the limit and max.open.segments ({max_open_segments}) + "
                f"{MIN_OTHER_DESCRIPTORS} for the log; raise the limit or lower the setting"
            )
        return cls(limit, connections, limit - DESCRIPTORS_PER_FETCH_CONNECTION * connections)
