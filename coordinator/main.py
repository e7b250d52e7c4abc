"""``tributary-coordinator``: run one coordinator (metadata, topic admin, consumer groups, election)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from coordinator.config import ENV_PREFIX, CoordinatorConfig
from services.config import ConfigError, add_config_arguments, config_from_args
from services.log_setup import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tributary-coordinator",
        description="Run a Tributary coordinator: cluster metadata, topic admin and consumer groups over etcd. "
        "Run several; "
        "one is elected the active controller, the others stand by. "
        f"Settings: flags > {ENV_PREFIX}_* environment > --config file.",
    )
    parser.add_argument("--config", type=Path, help="TOML or JSON file of settings")
    add_config_arguments(parser, CoordinatorConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(CoordinatorConfig, args, env_prefix=ENV_PREFIX)
    except ConfigError as exc:
        print(f"tributary-coordinator: {exc}", file=sys.stderr)
        return 2
    configure_logging(f"coordinator-{config.coordinator_id or 'auto'}", config.log_level, config.log_file)
    from coordinator.service import CoordinatorService  # after logging: imports log

    try:
        asyncio.run(CoordinatorService(config).run())
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
