"""``tributary-gateway``: run one gateway, the public gRPC front door (stateless; run several)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gateway.config import ENV_PREFIX, GatewayConfig
from services.config import ConfigError, add_config_arguments, config_from_args
from services.log_setup import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tributary-gateway",
        description="Run a Tributary gateway: the public Gateway gRPC service (produce, fetch, offsets, "
        f"metadata, admin). Settings: flags > {ENV_PREFIX}_* environment > --config file.",
    )
    parser.add_argument("--config", type=Path, help="TOML or JSON file of settings")
    add_config_arguments(parser, GatewayConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(GatewayConfig, args, env_prefix=ENV_PREFIX)
    except ConfigError as exc:
        print(f"tributary-gateway: {exc}", file=sys.stderr)
        return 2
    if not config.coordinators:
        print("tributary-gateway: --coordinators needs at least one host:port", file=sys.stderr)
        return 2
    configure_logging("gateway", config.log_level, config.log_file)
    from gateway.service import GatewayService

    try:
        asyncio.run(GatewayService(config).run())
    except ConfigError as exc:  # e.g. an unknown telemetry exporter, a missing optional package
        print(f"tributary-gateway: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
