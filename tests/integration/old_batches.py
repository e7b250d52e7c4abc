"""Put batches into a partition's log the way an older storage node stored them.

Storage nodes now refuse malformed records, so a poison pill can only be on disk if an older
version wrote it; that is the case consumers must still handle. :func:`plant` reproduces it: it
stops the node, appends the batches to the partition's active segment with base offsets that
continue the log and the leader epoch of the batch before (as the old node's append stamped them;
CRCs stay valid, both fields lie outside them), makes the next start recover the segment (the
recovery scan checks lengths, CRCs and dense offsets, as it always did), and starts the node again.
"""

from __future__ import annotations

from pathlib import Path

from launcher.local_cluster import LocalCluster
from services.records import iter_batches, read_batch_header, set_base_offset, set_partition_leader_epoch
from storage_node.log.files import CLEAN_SHUTDOWN_FILE


def _partition_dir(cluster: LocalCluster, node_id: int, topic: str, partition: int) -> Path:
    (directory,) = (cluster.data_dir / f"storage-{node_id}").rglob(f"{topic}-{partition}")
    return directory


def plant(cluster: LocalCluster, node_id: int, topic: str, partition: int, batches: list[bytes]) -> int:
    """Append ``batches`` to the log of ``topic``-``partition`` on stopped node ``node_id``;
    return the base offset the first one got. The node is running again afterwards."""
    cluster.storage_nodes[node_id].stop()
    directory = _partition_dir(cluster, node_id, topic, partition)
    segment = sorted(directory.glob("*.log"))[-1]
    stored = list(iter_batches(segment.read_bytes()))
    assert stored, f"{segment} holds no batch to continue from"
    next_offset, epoch = stored[-1].next_offset, stored[-1].partition_leader_epoch
    first = next_offset
    with segment.open("ab") as log:
        for data in batches:
            stamped = bytearray(data)
            set_base_offset(stamped, next_offset)
            set_partition_leader_epoch(stamped, epoch)
            log.write(stamped)
            next_offset = read_batch_header(stamped).next_offset
    (directory / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    cluster.start_storage_node(node_id)
    return first
