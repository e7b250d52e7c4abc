"""``tributary-coordinator``: run one coordinator (metadata, topic admin, consumer groups, election)."""

from __future__ import annotations

import argparse
import sys

from coordinator.config import ENV_PREFIX, CoordinatorConfig, config_problem
from services.entrypoint import build_service_parser, run_service


def build_parser() -> argparse.ArgumentParser:
    return build_service_parser(
        "tributary-coordinator",
        "Run a Tributary coordinator: cluster metadata, topic admin and consumer groups over etcd. Run "
        "several; one is elected the active controller, the others stand by.",
        CoordinatorConfig,
        ENV_PREFIX,
    )


async def _run(config: CoordinatorConfig) -> None:
    from coordinator.service import CoordinatorService  # after logging is configured: imports log

    await CoordinatorService(config).run()


def main(argv: list[str] | None = None) -> int:
    return run_service(
        build_parser(),
        argv,
        CoordinatorConfig,
        ENV_PREFIX,
        log_name=lambda config: f"coordinator-{config.coordinator_id or 'auto'}",
        run=_run,
        check=config_problem,
    )


if __name__ == "__main__":
    sys.exit(main())
