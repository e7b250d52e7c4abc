"""``tributary top``: a live view of the cluster, refreshed in place like ``top``.

Per storage node: partitions led, log size, and bytes/records in and bytes out per second (rates
from the nodes' traffic totals between two refreshes); per consumer group: state, members and
lag. Snapshots are collected over gRPC (the gateway for metadata and groups, each storage node's
DescribeLogDirs for sizes and traffic); :func:`render` is pure so it is tested without a cluster.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import grpc

from gateway.cli.connect import add_internal_tls_arguments, client_settings, internal_tls
from gateway.cli.output import replication_health, table
from gateway.client.client import client_tls
from gateway.client.credentials import TokenSource, bearer_call_credentials
from gateway.client.metadata import topic_from_proto
from services.proto import gateway_grpc, pb, storage_grpc
from services.tls import ClientTls, grpc_channel_credentials, sync_channel

CLEAR_SCREEN = "\x1b[H\x1b[2J"
CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeSample:
    node_id: int
    address: str
    leaders: int
    log_bytes: int
    bytes_in: int
    records_in: int
    bytes_out: int
    reachable: bool = True
    replicas: int = 0


@dataclass(frozen=True)
class GroupSample:
    group_id: str
    state: str
    members: int
    total_lag: int
    max_lag: int


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    nodes: dict[int, NodeSample] = field(default_factory=dict)
    groups: list[GroupSample] = field(default_factory=list)
    topics: int = 0
    partitions: int = 0
    offline: int = 0
    under_replicated: int = 0
    under_min_isr: int = 0
    #: Partition reassignments in progress (-1: could not be listed).
    reassigning: int = 0


def _rate(now: int, before: int | None, seconds: float) -> float | None:
    if before is None or seconds <= 0 or now < before:
        return None  # first sample, or the node restarted (its totals began again)
    return (now - before) / seconds


def _fmt_rate(value: float | None, unit: str, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value / scale:,.1f} {unit}"


def render(current: Snapshot, previous: Snapshot | None = None) -> str:
    """The screen for ``current``; rates need ``previous`` (else shown as ``-``)."""
    seconds = current.taken_at - previous.taken_at if previous else 0.0
    rows = []
    for node_id in sorted(current.nodes):
        node = current.nodes[node_id]
        before = previous.nodes.get(node_id) if previous else None
        if not node.reachable:
            rows.append([node_id, node.address, node.leaders, node.replicas, "-", "unreachable", "", ""])
            continue
        rows.append(
            [
                node_id,
                node.address,
                node.leaders,
                node.replicas,
                f"{node.log_bytes / 1e6:,.1f} MB",
                _fmt_rate(_rate(node.bytes_in, before.bytes_in if before else None, seconds), "MB/s", 1e6),
                _fmt_rate(_rate(node.records_in, before.records_in if before else None, seconds), "rec/s"),
                _fmt_rate(_rate(node.bytes_out, before.bytes_out if before else None, seconds), "MB/s", 1e6),
            ]
        )
    lines = [
        f"tributary top  {time.strftime('%H:%M:%S', time.localtime(current.taken_at))}   "
        f"topics {current.topics}  partitions {current.partitions}  offline {current.offline}  "
        f"under-replicated {current.under_replicated}  under-min-isr {current.under_min_isr}  "
        f"reassigning {current.reassigning if current.reassigning >= 0 else '?'}",
        "",
        table(["NODE", "ADDRESS", "LEADERS", "REPLICAS", "LOG SIZE", "IN", "IN RECORDS", "OUT"], rows),
        "",
    ]
    if current.groups:
        lines.append(
            table(
                ["GROUP", "STATE", "MEMBERS", "LAG", "MAX PARTITION LAG"],
                [
                    [g.group_id, g.state, g.members, f"{g.total_lag:,}", f"{g.max_lag:,}"]
                    for g in current.groups
                ],
            )
        )
    else:
        lines.append("no consumer groups")
    return "\n".join(lines)


def _node_sample(broker, leaders: int, replicas: int, tls: ClientTls | None = None) -> NodeSample:
    address = f"{broker.host}:{broker.grpc_port}"
    try:
        with sync_channel(address, tls) as channel:
            response = storage_grpc.StorageNodeStub(channel).DescribeLogDirs(
                pb.DescribeLogDirsRequest(), timeout=CALL_TIMEOUT_S
            )
    except grpc.RpcError:
        return NodeSample(broker.node_id, address, leaders, 0, 0, 0, 0, reachable=False, replicas=replicas)
    traffic = response.traffic
    log_bytes = sum(p.size_bytes for d in response.log_dirs for p in d.partitions)
    return NodeSample(
        broker.node_id,
        address,
        leaders,
        log_bytes,
        traffic.bytes_in,
        traffic.records_in,
        traffic.bytes_out,
        replicas=replicas,
    )


def _group_samples(stub) -> list[GroupSample]:
    samples: list[GroupSample] = []
    try:
        listing = stub.ListGroups(pb.ListGroupsRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError:
        return samples
    for group in listing.groups:
        try:
            described = stub.DescribeGroup(
                pb.DescribeGroupRequest(group_id=group.group_id), timeout=CALL_TIMEOUT_S
            )
        except grpc.RpcError:
            continue
        lags = [max(p.lag, 0) for p in described.partitions]
        samples.append(
            GroupSample(
                group.group_id, described.state, len(described.members), sum(lags), max(lags, default=0)
            )
        )
    return samples


def collect(
    gateway: str,
    credentials: grpc.ChannelCredentials | None = None,
    node_tls: ClientTls | None = None,
) -> Snapshot:
    """One snapshot of the cluster behind ``gateway`` (host:port; TLS with ``credentials``), the
    storage nodes asked directly (TLS with ``node_tls``: a member certificate)."""
    channel_to_gateway = (
        grpc.secure_channel(gateway, credentials) if credentials else grpc.insecure_channel(gateway)
    )
    with channel_to_gateway as channel:
        stub = gateway_grpc.GatewayStub(channel)
        metadata = stub.GetMetadata(pb.GetMetadataRequest(), timeout=CALL_TIMEOUT_S)
        groups = _group_samples(stub)
        try:
            moves = stub.ListPartitionReassignments(
                pb.ListPartitionReassignmentsRequest(), timeout=CALL_TIMEOUT_S
            )
            reassigning = len(moves.reassignments)
        except grpc.RpcError:
            reassigning = -1
    health = replication_health(topic_from_proto(t) for t in metadata.topics)
    nodes = {
        b.node_id: _node_sample(
            b, health.leaders.get(b.node_id, 0), health.replicas.get(b.node_id, 0), node_tls
        )
        for b in metadata.brokers
    }
    return Snapshot(
        time.time(),
        nodes,
        groups,
        len(metadata.topics),
        health.partitions,
        health.offline,
        health.under_replicated,
        health.under_min_isr,
        reassigning,
    )


def run(args) -> int:
    """``tributary top [--interval S] [--iterations N]``: refresh until Ctrl-C or N screens."""
    settings = client_settings(args)
    gateway = settings["servers"].split(",")[0]
    tls = client_tls(
        settings.get("security_protocol", "PLAINTEXT"),
        settings.get("ssl_cafile"),
        settings.get("ssl_certfile"),
        settings.get("ssl_keyfile"),
    )
    credentials = grpc_channel_credentials(tls) if tls is not None else None
    if credentials is not None and settings.get("sasl_oauth_token_provider") is not None:
        source = TokenSource(settings["sasl_oauth_token_provider"])
        credentials = grpc.composite_channel_credentials(credentials, bearer_call_credentials(source))
    node_tls = internal_tls(args)
    interactive = sys.stdout.isatty()
    previous = None
    shown = 0
    try:
        while args.iterations is None or shown < args.iterations:
            current = collect(gateway, credentials, node_tls)
            screen = render(current, previous)
            sys.stdout.write((CLEAR_SCREEN if interactive else ("\n" if shown else "")) + screen + "\n")
            sys.stdout.flush()
            previous, shown = current, shown + 1
            if args.iterations is None or shown < args.iterations:
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0


def add_parser(commands, common) -> None:
    """Register ``top`` on the CLI's subcommands (``common`` adds --gateway/--data-dir)."""
    parser = commands.add_parser("top", help="live view: per node partitions and traffic, per group lag")
    common(parser)
    add_internal_tls_arguments(parser)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument(
        "--iterations", type=int, default=None, help="stop after N screens (default: until Ctrl-C)"
    )
    parser.set_defaults(func=run)
