"""``tributary cluster up | down | status``: the local cluster, detached, in a data directory."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.cli.connect import CliError, cluster_tls, data_dir_of, ensure_reachable
from gateway.cli.output import (
    PARTITION_HEADERS,
    TOPIC_SUMMARY_HEADERS,
    Progress,
    partition_rows,
    replication_health,
    table,
    topic_summary_rows,
)
from gateway.client import Admin
from gateway.client.servers import START_HINT, cluster_file_tls
from launcher.local_cluster import (
    LocalClusterSpec,
    cluster_down,
    cluster_status,
    cluster_up,
    read_cluster_file,
    read_launch_file,
)
from launcher.processes import ServiceStartError


def _spec(args):
    """The spec to run: the data dir's previous one, overridden by the flags given."""
    previous = (read_launch_file(data_dir_of(args)) or {}).get("spec")
    spec = LocalClusterSpec(**previous) if previous else LocalClusterSpec()
    overrides = {
        name: getattr(args, name)
        for name in ("storage_nodes", "coordinators", "gateways")
        if getattr(args, name, None) is not None
    }
    for name, value in overrides.items():
        if value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1", 2)
    if getattr(args, "secure", False):
        overrides["secure"] = True  # stays secure on later `cluster up`s (launch.json keeps it)
    return dataclasses.replace(spec, **overrides)


def up(args) -> int:
    data_dir = data_dir_of(args)
    progress = Progress()
    progress.step(f"bringing up the local cluster in {data_dir}")
    try:
        cluster, actions = cluster_up(data_dir, _spec(args), progress=progress.step)
    except (ServiceStartError, RuntimeError, OSError) as exc:
        raise CliError(f"could not start the cluster: {exc}") from None
    started = [name for name, action in actions.items() if action == "started"]
    if started:
        progress.step(f"started {', '.join(started)}")
    else:
        progress.step("everything was already running")
    print(table(("PROCESS", "PID", "ADDRESS", "STATE", "LOG"), _status_rows(cluster.status())))
    print(
        f"\ngateway: {cluster.servers}   (export TRIBUTARY_GATEWAY={cluster.servers}, "
        f"or run commands from this directory)"
    )
    if cluster.pki is not None:
        print(
            f"TLS: mutual TLS on the gateway; CA {cluster.pki.ca_file}, admin client certificate "
            f"{cluster.pki.client_cert} (the CLI uses it for this cluster)\n"
            f"     mutual TLS between every process on the internal ports; cluster CA "
            f"{cluster.pki.cluster_ca_file}, member certificates in {cluster.pki.members_dir}"
        )
    return 0


def down(args) -> int:
    data_dir = data_dir_of(args)
    if read_cluster_file(data_dir) is None:
        print(f"no cluster is running in {data_dir}")
        return 0
    progress = Progress()
    stopped = cluster_down(data_dir, progress=progress.step)
    print(f"stopped {len(stopped)} processes; data kept in {data_dir}")
    return 0


def _status_rows(statuses) -> list[list[object]]:
    return [[s.name, s.pid or "-", s.address, "alive" if s.alive else "dead", s.log] for s in statuses]


def status(args) -> int:
    """Each process alive or dead, then the storage nodes and partitions the cluster reports."""
    data_dir = data_dir_of(args)
    statuses = cluster_status(data_dir)
    if statuses is None or read_cluster_file(data_dir) is None:
        raise CliError(f"no cluster is running in {data_dir}; {START_HINT}")
    print(table(("PROCESS", "PID", "ADDRESS", "STATE", "LOG"), _status_rows(statuses)))
    gateways = [s.address for s in statuses if s.name.startswith("gateway") and s.alive]
    all_alive = all(s.alive for s in statuses)
    if not gateways:
        print(
            f"\nno gateway is alive; run `tributary cluster up --data-dir {data_dir}` to restart what is down"
        )
        return 1
    tls_settings: dict[str, Any] = dict(cluster_file_tls(data_dir))
    ensure_reachable(gateways, tls=cluster_tls(tls_settings))
    with Admin(servers=",".join(gateways), request_timeout_ms=10_000, **tls_settings) as admin:
        cluster, topics = admin.metadata()
        moves = admin.list_partition_reassignments()
    health = replication_health(topics)
    print(f"\ncluster {cluster.cluster_id or '-'}  controller {cluster.controller_id or 'none'}")
    print(
        f"partitions {health.partitions}  offline {health.offline}  under-replicated "
        f"{health.under_replicated}  under-min-isr {health.under_min_isr}  reassigning {len(moves)}"
    )
    print(
        table(
            ("NODE", "HOST", "PORT", "FETCH PORT", "LEADERS", "REPLICAS"),
            [
                [
                    b.node_id,
                    b.host,
                    b.port,
                    b.fetch_port,
                    health.leaders.get(b.node_id, 0),
                    health.replicas.get(b.node_id, 0),
                ]
                for b in cluster.brokers
            ],
        )
    )
    print()
    if getattr(args, "partitions", False):
        rows = [row for topic in topics for row in partition_rows(topic.partitions)]
        print(table(PARTITION_HEADERS, rows) if rows else "no topics")
    else:  # one line per topic: tens of thousands of partition rows help nobody read a status
        print(table(TOPIC_SUMMARY_HEADERS, topic_summary_rows(topics)) if topics else "no topics")
    return 0 if all_alive else 1
