"""Finding the cluster for a CLI command, and failing with one helpful line when it is not up.

Order: ``--gateway HOST:PORT``, then ``$TRIBUTARY_GATEWAY``, then the ``cluster.json`` of the
data directory (``--data-dir``, ``$TRIBUTARY_DATA_DIR``, ``./.tributary``). Before any client is
built, the addresses are probed (a gRPC connection, a few seconds at most), so "the cluster is
not up" is reported at once instead of after the clients' retry timeouts.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from gateway.client.errors import NoServersError
from gateway.client.servers import (
    CLUSTER_FILE,
    START_HINT,
    cluster_file_gateways,
    default_data_dir,
    resolve_servers,
)

PROBE_TIMEOUT_S = 3.0


class CliError(Exception):
    """A failure the CLI reports as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def data_dir_of(args) -> Path:
    return Path(args.data_dir) if getattr(args, "data_dir", None) else default_data_dir()


def gateway_addresses(args) -> list[str]:
    """The gateways this command should talk to (see the module docstring)."""
    data_dir = data_dir_of(args)
    try:
        return resolve_servers(getattr(args, "gateway", None), data_dir=data_dir)
    except NoServersError:
        raise CliError(
            f"no cluster found (no --gateway, no TRIBUTARY_GATEWAY, no {data_dir / CLUSTER_FILE}); "
            f"{START_HINT}"
        ) from None
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def ensure_reachable(
    addresses: list[str], *, timeout_s: float = PROBE_TIMEOUT_S, data_dir: Path | None = None
) -> None:
    """Raise :class:`CliError` unless at least one gateway accepts a connection."""
    for address in addresses:
        channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s / max(1, len(addresses)))
            return
        except grpc.FutureTimeoutError:
            continue
        finally:
            channel.close()
    where = ",".join(addresses)
    local = data_dir is not None and cluster_file_gateways(data_dir) == addresses
    hint = (
        f"the local cluster in {data_dir} is not running; {START_HINT}"
        if local
        else f"is the cluster up? {START_HINT}"
    )
    raise CliError(f"cannot reach a gateway at {where}: {hint}")


def connect(args) -> str:
    """The ``servers=`` string for SDK clients, after checking the cluster answers."""
    addresses = gateway_addresses(args)
    ensure_reachable(addresses, data_dir=data_dir_of(args))
    return ",".join(addresses)
