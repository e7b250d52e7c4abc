"""Finding the cluster for a CLI command, and failing with one helpful line when it is not up.

Order: ``--gateway HOST:PORT``, then ``$TRIBUTARY_GATEWAY``, then the ``cluster.json`` of the
data directory (``--data-dir``, ``$TRIBUTARY_DATA_DIR``, ``./.tributary``). Before any client is
built, the addresses are probed (a gRPC connection, a few seconds at most), so "the cluster is
not up" is reported at once instead of after the clients' retry timeouts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from gateway.client.client import client_tls
from gateway.client.errors import NoServersError
from gateway.client.servers import (
    CLUSTER_FILE,
    GATEWAY_ENV,
    START_HINT,
    cluster_file_gateways,
    cluster_file_internal_tls,
    cluster_file_tls,
    default_data_dir,
    resolve_servers,
)
from services.tls import ClientTls, client_tls_problem, grpc_channel_credentials

PROBE_TIMEOUT_S = 3.0
#: A file holding the bearer token CLI commands present (same as ``--token-file``).
TOKEN_FILE_ENV = "TRIBUTARY_TOKEN_FILE"
#: How long a CLI command waits for one request (the clients' default is 30 s; an operator at a
#: terminal hears sooner that something is wrong).
CLI_REQUEST_TIMEOUT_MS = 15_000


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
    addresses: list[str],
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    data_dir: Path | None = None,
    tls: ClientTls | None = None,
) -> None:
    """Raise :class:`CliError` unless at least one gateway accepts a connection (a TLS one
    when ``tls`` is given)."""
    credentials = grpc_channel_credentials(tls) if tls is not None else None
    for address in addresses:
        channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
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


def security_settings(args) -> dict[str, Any]:
    """The SDK's TLS settings from ``--ssl-cafile/--ssl-certfile/--ssl-keyfile`` (or
    ``$TRIBUTARY_SSL_CAFILE`` ...): any of them turns TLS on (``security_protocol="SSL"``).
    Without them, a local cluster started with ``--secure`` whose gateways this command uses
    (no ``--gateway``, no ``$TRIBUTARY_GATEWAY``) lends its admin client's, from cluster.json."""
    files = {
        name: getattr(args, name, None) or os.environ.get(f"TRIBUTARY_{name.upper()}") or None
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    }
    token_file = getattr(args, "token_file", None) or os.environ.get(TOKEN_FILE_ENV) or None
    if token_file is not None:
        return {
            "security_protocol": "SASL_SSL",
            **files,
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": token_file_provider(Path(token_file)),
        }
    if any(files.values()):
        return {"security_protocol": "SSL", **files}
    if getattr(args, "gateway", None) or os.environ.get(GATEWAY_ENV):
        return {}
    return dict(cluster_file_tls(data_dir_of(args)))


def token_file_provider(path: Path) -> Callable[[], str]:
    """A token provider reading ``path`` each time a token is needed (a file an identity
    provider's agent refreshes keeps working); CliError when it cannot be read now."""

    def read() -> str:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read the token file {path}: {exc.strerror}", 2) from None

    read()
    return read


#: The flags of :func:`internal_tls` (and ``$TRIBUTARY_INTERNAL_SSL_CAFILE`` ...).
INTERNAL_TLS_FLAGS = ("internal_ssl_cafile", "internal_ssl_certfile", "internal_ssl_keyfile")


def add_internal_tls_arguments(parser) -> None:
    """The flags of a command that also asks storage nodes directly (their internal gRPC port)."""
    group = parser.add_argument_group(
        "internal TLS (storage nodes' ports; all three, or $TRIBUTARY_INTERNAL_SSL_CAFILE ...)"
    )
    group.add_argument(
        "--internal-ssl-cafile", metavar="PEM", help="the cluster CA the nodes' certificates chain to"
    )
    group.add_argument(
        "--internal-ssl-certfile", metavar="PEM", help="a member certificate of the cluster CA"
    )
    group.add_argument("--internal-ssl-keyfile", metavar="PEM", help="key of --internal-ssl-certfile")
    group.add_argument(
        "--internal-ssl-server-name",
        metavar="NAME",
        help="the name the nodes' certificates carry if not their addresses (internal_tls_server_name)",
    )


def internal_tls(args) -> ClientTls | None:
    """The TLS for asking storage nodes directly (a cluster with internal TLS accepts only a
    member certificate of its cluster CA there): ``--internal-ssl-*`` (or
    ``$TRIBUTARY_INTERNAL_SSL_*``), all three; without them, a local cluster started with
    ``--secure`` whose gateways this command uses lends the CLI's member certificate from
    cluster.json. None: plaintext. CliError when only some are given."""
    files = {
        name: getattr(args, name, None) or os.environ.get(f"TRIBUTARY_{name.upper()}") or None
        for name in INTERNAL_TLS_FLAGS
    }
    if not any(files.values()) and not (getattr(args, "gateway", None) or os.environ.get(GATEWAY_ENV)):
        files = {f"internal_{k}": v for k, v in cluster_file_internal_tls(data_dir_of(args)).items()}
    if not any(files.values()):
        return None
    missing = [f"--{name.replace('_', '-')}" for name in INTERNAL_TLS_FLAGS if not files.get(name)]
    if missing:
        raise CliError(f"internal TLS needs a member certificate: {', '.join(missing)} not given", 2)
    ca, cert, key = (Path(str(files[name])) for name in INTERNAL_TLS_FLAGS)
    server_name = getattr(args, "internal_ssl_server_name", None) or os.environ.get(
        "TRIBUTARY_INTERNAL_SSL_SERVER_NAME"
    )
    tls = ClientTls(ca, cert, key, server_name or None)
    problem = client_tls_problem(tls)
    if problem is not None:
        raise CliError(problem, 2)
    return tls


def cluster_tls(settings: dict[str, Any]) -> ClientTls | None:
    """The ClientTls of SDK settings (None: plaintext); CliError when they do not add up."""
    try:
        return client_tls(
            settings.get("security_protocol", "PLAINTEXT"),
            settings.get("ssl_cafile"),
            settings.get("ssl_certfile"),
            settings.get("ssl_keyfile"),
        )
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def client_settings(args) -> dict[str, Any]:
    """``servers=`` and the TLS settings for SDK clients, after checking the cluster answers."""
    security = security_settings(args)
    tls = cluster_tls(security)
    addresses = gateway_addresses(args)
    ensure_reachable(addresses, data_dir=data_dir_of(args), tls=tls)
    return {"servers": ",".join(addresses), **security}


def connect(args) -> str:
    """The ``servers=`` string for SDK clients, after checking the cluster answers."""
    return client_settings(args)["servers"]
