"""``tributary-storage-node``: run one storage node (the broker)."""

from __future__ import annotations

import argparse
import sys

from services.entrypoint import build_service_parser, run_service
from services.malloc_tuning import keep_large_buffers_in_heap, start_heap_trimmer
from services.tls import member_tls_problem
from storage_node.config import ENV_PREFIX, StorageNodeConfig
from storage_node.descriptors import raise_descriptor_limit
from storage_node.registration import NodeIdInUseError

#: Exit code when another live node holds this node id.
EXIT_NODE_ID_IN_USE = 3


def build_parser() -> argparse.ArgumentParser:
    return build_service_parser(
        "tributary-storage-node",
        "Run a Tributary storage node: partition logs on local disk, the StorageNode gRPC service and "
        "the zero-copy fetch port.",
        StorageNodeConfig,
        ENV_PREFIX,
    )


async def _run(config: StorageNodeConfig) -> None:
    from storage_node.node import StorageNode  # after logging is configured: imports log

    keep_large_buffers_in_heap()  # megabyte requests: see services/malloc_tuning.py
    raise_descriptor_limit()  # the fetch port's share is sized from it: storage_node/descriptors.py

    trimmer = start_heap_trimmer()  # and give a burst's memory back once it is over
    try:
        await StorageNode(config).run()
    finally:
        if trimmer is not None:
            trimmer.cancel()


def main(argv: list[str] | None = None) -> int:
    return run_service(
        build_parser(),
        argv,
        StorageNodeConfig,
        ENV_PREFIX,
        log_name=lambda config: f"storage-{config.node_id}",
        run=_run,
        check=member_tls_problem,
        exit_codes={NodeIdInUseError: EXIT_NODE_ID_IN_USE},
    )


if __name__ == "__main__":
    sys.exit(main())
