"""The package contract: a pure module set with the public names other services code against."""

from __future__ import annotations

import ast
import inspect
import pathlib
import struct

import services.records as records
from services.records import format as fmt

ALLOWED_IMPORTS = {
    # os: record.py reads TRIBUTARY_NO_EXTENSIONS to choose the codec backend, nothing else.
    "__future__",
    # array: columns.py packs Arrow buffers (typed arrays of ints, pure, in memory).
    "array",
    "collections",
    "enum",
    # heapq: aborted.py orders aborted transactions by first offset (pure, in memory).
    "heapq",
    "os",
    "struct",
    "threading",
    "typing",
    "zlib",
    "crc32c",
    "lz4",
    "snappy",
    "zstandard",
    "services",
}


def test_imports_are_pure():
    package_dir = pathlib.Path(records.__file__).parent
    for path in sorted(package_dir.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
                if roots == {"services"}:
                    assert node.module == "services.errors" or node.module.startswith("services.records"), (
                        path.name,
                        node.module,
                    )
            else:
                continue
            assert roots <= ALLOWED_IMPORTS, (path.name, roots - ALLOWED_IMPORTS)


def test_public_names():
    expected = {
        "MAGIC",
        "LOG_OVERHEAD",
        "RECORD_BATCH_OVERHEAD",
        "Compression",
        "TimestampType",
        "Record",
        "RecordBatchBuilder",
        "RecordBatchView",
        "iter_batches",
        "set_base_offset",
        "set_partition_leader_epoch",
        "set_log_append_time",
        "read_batch_header",
        "BatchHeader",
        "speedups_enabled",
    }
    assert expected <= set(records.__all__)
    for name in records.__all__:
        assert getattr(records, name) is not None
    assert records.Record._fields == ("offset", "timestamp", "key", "value", "headers")
    assert [c.name for c in records.Compression] == ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"]
    assert [int(c) for c in records.Compression] == [0, 1, 2, 3, 4]
    assert (records.TimestampType.CREATE_TIME, records.TimestampType.LOG_APPEND_TIME) == (0, 1)


def test_builder_signature_is_keyword_only():
    parameters = inspect.signature(records.RecordBatchBuilder).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    append = inspect.signature(records.RecordBatchBuilder.append).parameters
    assert append["timestamp"].kind is inspect.Parameter.KEYWORD_ONLY


def test_header_offsets_match_the_struct():
    assert fmt.HEADER_STRUCT.size == fmt.RECORD_BATCH_OVERHEAD == 61
    sample = fmt.HEADER_STRUCT.pack(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
    for offset, code, value in [
        (fmt.BASE_OFFSET_OFFSET, ">q", 1),
        (fmt.BATCH_LENGTH_OFFSET, ">i", 2),
        (fmt.PARTITION_LEADER_EPOCH_OFFSET, ">i", 3),
        (fmt.MAGIC_OFFSET, ">b", 4),
        (fmt.CRC_OFFSET, ">I", 5),
        (fmt.ATTRIBUTES_OFFSET, ">h", 6),
        (fmt.LAST_OFFSET_DELTA_OFFSET, ">i", 7),
        (fmt.BASE_TIMESTAMP_OFFSET, ">q", 8),
        (fmt.MAX_TIMESTAMP_OFFSET, ">q", 9),
        (fmt.PRODUCER_ID_OFFSET, ">q", 10),
        (fmt.PRODUCER_EPOCH_OFFSET, ">h", 11),
        (fmt.BASE_SEQUENCE_OFFSET, ">i", 12),
        (fmt.RECORD_COUNT_OFFSET, ">i", 13),
    ]:
        assert struct.unpack_from(code, sample, offset) == (value,)
    # Kafka's DefaultRecordBatch constants.
    assert (fmt.CRC_OFFSET, fmt.ATTRIBUTES_OFFSET, fmt.RECORDS_OFFSET) == (17, 21, 61)
