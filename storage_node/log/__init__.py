"""The storage node's partition logs on local disk, one small module per on-disk artefact.

============================  ===========================================================
module                        holds
============================  ===========================================================
``files``                     suffixes, zero-padded segment names, partition dir names
``file_records``              ``FileRecords`` (one ``.log``), ``FileSlice`` (zero-copy read)
``index``                     the shared sparse fixed-width index base
``offset_index``              ``.index``: batch base offset -> byte position
``time_index``                ``.timeindex``: largest timestamp -> offset
``segment``                   ``Segment``: a ``.log`` with its two indexes; recovery
``segments``                  segments sorted by base offset (copy-on-write)
``checkpoint``                recovery-point / log-start-offset checkpoint files
``loader``                    startup recovery in numbered passes
``retention``                 deletion policies as predicates
``validation``                producer-batch validation before any write
``partition_log``             ``PartitionLog``: append, read, list offsets, flush, retention
``group_commit``              ``GroupCommit``: coalesced fsync for asyncio callers
``log_manager``               ``LogManager``: all partitions over several log dirs
``config``                    ``LogConfig`` from Kafka-named topic configs
``cleaner`` (package)         the log cleaner: compaction of ``cleanup.policy=compact``
============================  ===========================================================

Record batches are opaque here: only their headers are read (``services.records``), except for
producer validation and ListOffsets-by-time, which decode one payload each, and the log cleaner,
which decodes the batches it compacts.
"""

from storage_node.log.config import LogConfig
from storage_node.log.file_records import FileSlice
from storage_node.log.group_commit import GroupCommit
from storage_node.log.log_manager import LogManager
from storage_node.log.partition_log import AppendInfo, FetchInfo, PartitionLog

__all__ = ["AppendInfo", "FetchInfo", "FileSlice", "GroupCommit", "LogConfig", "LogManager", "PartitionLog"]
