"""``ConsumerRebalanceListener``: what an application hears when its group moves partitions.

Kafka's contract, kept here:

* Listener methods run inside ``poll()`` (and ``close()``/``unsubscribe()``): on the application's
  thread for the thread-based ``Consumer``, awaited on the event loop for ``AsyncConsumer``
  (methods may then be coroutines). So a listener may call the consumer -- ``commit()``,
  ``seek()``, ``position()`` -- and it never runs concurrently with the application's own code.
* ``on_partitions_revoked`` runs while the consumer still owns the partitions: a commit made there
  is accepted, and no other member reads them until it returns. Across the group, every member's
  ``on_partitions_revoked`` for a partition completes before any member's
  ``on_partitions_assigned`` for it (the coordinator grants a partition only once its previous
  owner reported giving it up).
* With ``enable_auto_commit`` the consumer commits the revoked partitions' positions itself,
  before calling ``on_partitions_revoked``; without it, committing there is the application's job.
* ``on_partitions_assigned`` runs before the new partitions are fetched: a ``seek`` there decides
  where consumption starts; otherwise it starts at the group's committed offset, else at
  ``auto_offset_reset``.
* ``on_partitions_lost`` replaces ``on_partitions_revoked`` when the membership ended without a
  hand-over (session timeout, no ``poll`` within ``max_poll_interval_ms``, fenced static member,
  a partition found moved by a commit): the partitions may belong to another member already, so
  committing them would fail. By default it calls ``on_partitions_revoked``, as Kafka's does.
* A method is called only with a non-empty set: eager assignors (range, roundrobin, sticky)
  revoke everything and then assign the new set; cooperative-sticky revokes only what moves.

An exception raised by a listener does not stop the rebalance (the partitions are given up or
taken all the same); ``poll()`` raises it once the rebalance step is done.
"""

from __future__ import annotations

from collections.abc import Set

from gateway.client.structs import TopicPartition


class ConsumerRebalanceListener:
    """Subclass and override what you need; any object with these methods works as well."""

    def on_partitions_revoked(self, revoked: Set[TopicPartition]) -> None:
        """The consumer is about to stop consuming ``revoked`` (still owned during the call)."""

    def on_partitions_assigned(self, assigned: Set[TopicPartition]) -> None:
        """The consumer now owns ``assigned`` and will start consuming them after this returns."""

    def on_partitions_lost(self, lost: Set[TopicPartition]) -> None:
        """The consumer lost ``lost`` without a hand-over; by default, as if revoked."""
        return self.on_partitions_revoked(lost)


def listener_method(listener, name: str):
    """The bound listener method ``name`` (``on_partitions_lost`` falls back to
    ``on_partitions_revoked`` for duck-typed listeners), or None."""
    if listener is None:
        return None
    method = getattr(listener, name, None)
    if method is None and name == "on_partitions_lost":
        method = getattr(listener, "on_partitions_revoked", None)
    return method
