"""``tributary-storage-node``: run one storage node (the broker)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from services.config import ConfigError, add_config_arguments, config_from_args
from services.log_setup import configure_logging
from storage_node.config import ENV_PREFIX, StorageNodeConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tributary-storage-node",
        description="Run a Tributary storage node: partition logs on local disk, the StorageNode gRPC "
        f"service and the zero-copy fetch port. Settings: flags > {ENV_PREFIX}_* environment > --config file.",
    )
    parser.add_argument("--config", type=Path, help="TOML or JSON file of settings (Kafka-style names allowed)")
    add_config_arguments(parser, StorageNodeConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(StorageNodeConfig, args, env_prefix=ENV_PREFIX)
    except ConfigError as exc:
        print(f"tributary-storage-node: {exc}", file=sys.stderr)
        return 2
    configure_logging(f"storage-{config.node_id}", config.log_level, config.log_file)
    from services.errors import TributaryError
    from storage_node.node import StorageNode
    from storage_node.registration import NodeIdInUseError

    try:
        asyncio.run(StorageNode(config).run())
    except NodeIdInUseError as exc:
        print(f"tributary-storage-node: {exc}", file=sys.stderr)
        return 3
    except ConfigError as exc:  # e.g. an unknown telemetry exporter, a missing optional package
        print(f"tributary-storage-node: {exc}", file=sys.stderr)
        return 2
    except TributaryError as exc:
        print(f"tributary-storage-node: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
