"""``tributary-gateway``: run one gateway, the public gRPC front door (stateless; run several)."""

from __future__ import annotations

import argparse
import sys

from gateway.server.config import ENV_PREFIX, GatewayConfig
from services.entrypoint import build_service_parser, run_service
from services.malloc_tuning import keep_large_buffers_in_heap, start_heap_trimmer
from services.tls import member_tls_problem, server_tls_problem
from services.tokens import TokenVerifier


def build_parser() -> argparse.ArgumentParser:
    return build_service_parser(
        "tributary-gateway",
        "Run a Tributary gateway: the public Gateway gRPC service "
        "(produce, fetch, offsets, metadata, admin).",
        GatewayConfig,
        ENV_PREFIX,
    )


async def _run(config: GatewayConfig) -> None:
    from gateway.server.service import GatewayService  # after logging is configured: imports log

    keep_large_buffers_in_heap()  # megabyte requests: see services/malloc_tuning.py

    trimmer = start_heap_trimmer()  # and give a burst's memory back once it is over
    try:
        await GatewayService(config).run()
    finally:
        if trimmer is not None:
            trimmer.cancel()


def _check(config: GatewayConfig) -> str | None:
    """A message for settings the gateway cannot run with, else None."""
    if not config.coordinators:
        return "--coordinators needs at least one host:port"
    if config.produce_stream_max_idle_ms < 0:
        return "--produce-stream-max-idle-ms must be 0 (never) or more"
    for name in ("fetch_max_decoded_records", "fetch_max_decoded_bytes", "fetch_decode_threads"):
        if getattr(config, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    problem = server_tls_problem(
        config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    ) or member_tls_problem(config)
    if problem is not None or config.token_public_key_file is None:
        return problem
    if config.tls_cert_file is None:
        return (
            "--token-public-key-file needs TLS (--tls-cert-file, --tls-key-file): a bearer token "
            "sent in the clear can be replayed"
        )
    if config.tls_client_ca_file is not None:
        return (
            "--token-public-key-file and --tls-client-ca-file: a gateway authenticates clients by "
            "certificate or by token, not both (run one gateway of each kind)"
        )
    try:
        TokenVerifier.from_file(config.token_public_key_file)
    except ValueError as exc:
        return f"--token-public-key-file: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    return run_service(
        build_parser(),
        argv,
        GatewayConfig,
        ENV_PREFIX,
        log_name=lambda config: "gateway",
        check=_check,
        run=_run,
    )


if __name__ == "__main__":
    sys.exit(main())
