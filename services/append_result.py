"""``AppendResult``: one partition's answer to an append, from the storage node to the gateway.

The storage node's handlers return it, ``StorageNode.Append`` carries it as a
``PartitionAppendResult`` (:func:`services.serde.append_result_to_proto` /
:func:`~services.serde.append_result_from_proto`), and the gateway keeps it through its retries
and per-stream append queues until it answers the producer with a ``PartitionProduceResult``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from services import errors


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where one partition's appended batches landed, or why they did not (``error`` set).

    Offsets are -1 when not known: on error, and for ``acks=0`` (the answer did not wait).
    """

    topic: str
    partition: int
    base_offset: int = -1
    last_offset: int = -1
    #: The broker's append time (ms) for LogAppendTime topics, else -1.
    log_append_time: int = -1
    log_start_offset: int = -1
    record_count: int = 0
    error: errors.TributaryError | None = None
