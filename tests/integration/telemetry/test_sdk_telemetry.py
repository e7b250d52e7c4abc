"""Telemetry as a user meets it: ``tributary cluster up`` with ``OTEL_TRACES_EXPORTER=console``
puts each service's spans in its log, and an application's own OpenTelemetry SDK sees the
Tributary SDK's spans and metrics -- one produce being one trace from the application through
the SDK, the gateway and the storage node (the services' halves read from their logs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from launcher.local_cluster import LocalCluster, read_cluster_file
from services.telemetry import names

REPO = Path(__file__).resolve().parents[3]
APP = Path(__file__).with_name("sdk_traced_app.py")


def run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRIBUTARY_"))}
    environment.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=environment, timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("console-cluster")
    # Spans exported 100 ms after they end rather than 5 s (the batch processor's default).
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        up = run(
            sys.executable, "-m", "gateway.cli.main", "cluster", "up", "--data-dir", str(directory), env=env
        )
        assert up.returncode == 0, up.stderr
        yield directory
    finally:
        run(sys.executable, "-m", "gateway.cli.main", "cluster", "down", "--data-dir", str(directory))
        LocalCluster.from_data_dir(directory).stop()


def console_spans(log: Path) -> list[dict]:
    """The spans ConsoleSpanExporter printed into a service's log (JSON objects starting with a
    ``{`` line and ending with a ``}`` line, between the log lines)."""
    spans, current = [], None
    for line in log.read_text(errors="replace").splitlines():
        if current is None and line == "{":
            current = [line]
        elif current is not None:
            current.append(line)
            if line == "}":
                spans.append(json.loads("\n".join(current)))
                current = None
    return spans


def wait_for_spans(log: Path, trace_id: str, names: set[str]) -> list[dict]:
    deadline = time.monotonic() + 20
    while True:
        found = [s for s in console_spans(log) if s["context"]["trace_id"] == trace_id]
        if names <= {s["name"] for s in found}:
            return found
        assert time.monotonic() < deadline, f"{log.name}: {sorted(s['name'] for s in found)}, wanted {names}"
        time.sleep(0.1)


def test_spans_land_in_the_logs_and_one_produce_is_one_trace_through_the_sdk(data_dir):
    gateway = read_cluster_file(data_dir)["gateway"]
    topic = f"traced-{uuid.uuid4().hex[:8]}"
    app = run(sys.executable, str(APP), gateway, topic)
    assert app.returncode == 0, app.stderr
    report = json.loads(app.stdout)
    spans = report["spans"]

    # The application's span > the SDK's PRODUCER span > the SDK's gRPC CLIENT span.
    (checkout,) = [s for s in spans if s["name"] == "checkout"]
    (send,) = [s for s in spans if s["name"] == f"send {topic}" and s["parent_id"] == checkout["span_id"]]
    assert send["kind"] == "PRODUCER" and send["status"] == "UNSET"
    assert send["attributes"]["messaging.kafka.offset"] == report["unary_offset"]
    assert send["attributes"]["messaging.client.id"] == "traced-app"
    assert send["attributes"]["messaging.kafka.message.key"] == "order-1"
    (client,) = [
        s for s in spans if s["name"] == "tributary.v1.Gateway/Produce" and s["parent_id"] == send["span_id"]
    ]
    assert client["kind"] == "CLIENT" and client["trace_id"] == send["trace_id"] == checkout["trace_id"]

    # ... and in the services' own logs, printed by their console exporters: the same trace.
    run_dir = data_dir / "run"
    gateway_spans = wait_for_spans(
        run_dir / "gateway-0.log", client["trace_id"], {"tributary.v1.Gateway/Produce"}
    )
    # (The trace also holds the metadata lookups the first send of a topic makes.)
    (server,) = [
        s
        for s in gateway_spans
        if s["kind"] == "SpanKind.SERVER" and s["name"] == "tributary.v1.Gateway/Produce"
    ]
    assert server["parent_id"] == client["span_id"]
    assert server["resource"]["attributes"]["service.name"] == "tributary-gateway"
    node_logs = sorted(run_dir.glob("storage-*.log"))
    deadline = time.monotonic() + 20
    while not any(
        s["context"]["trace_id"] == client["trace_id"] for log in node_logs for s in console_spans(log)
    ):
        assert time.monotonic() < deadline, "no storage node printed a span of the trace"
        time.sleep(0.1)
    node_spans = [
        s for log in node_logs for s in console_spans(log) if s["context"]["trace_id"] == client["trace_id"]
    ]
    gateway_ids = {s["context"]["span_id"] for s in gateway_spans}
    # The gateway appends over the node's data port (its spans named like the gRPC method).
    assert any(s["name"] == names.SPAN_DATA_PORT_APPEND and s["parent_id"] in gateway_ids for s in node_spans)

    # Over the raw data listener: the gateway's data span is the child of the send span (the frame
    # carries its traceparent), and the storage node's Append joins the same trace.
    (checkout_raw,) = [s for s in spans if s["name"] == "checkout-raw"]
    (send_raw,) = [
        s for s in spans if s["name"] == f"send {topic}" and s["parent_id"] == checkout_raw["span_id"]
    ]
    assert send_raw["attributes"]["messaging.kafka.offset"] == report["raw_offset"]
    raw_trace = send_raw["trace_id"]
    data_spans = wait_for_spans(run_dir / "gateway-0.log", raw_trace, {f"data produce {topic}"})
    (data_span,) = [s for s in data_spans if s["name"] == f"data produce {topic}"]
    assert data_span["kind"] == "SpanKind.SERVER" and data_span["parent_id"] == send_raw["span_id"]
    deadline = time.monotonic() + 20
    while not any(
        s["name"] == names.SPAN_DATA_PORT_APPEND and s["context"]["trace_id"] == raw_trace
        for log in node_logs
        for s in console_spans(log)
    ):
        assert time.monotonic() < deadline, "no storage node printed an Append of the raw request's trace"
        time.sleep(0.1)

    # Every record sent has its span, a refused one with its error; polls that brought records too.
    streamed = [s for s in spans if s["name"] == f"send {topic}" and s["parent_id"] is None]
    assert len(streamed) == 4 and all("messaging.kafka.offset" in s["attributes"] for s in streamed)
    (refused,) = [s for s in spans if s["name"] == f"send {topic}-small"]
    assert refused["status"] == "ERROR" and refused["attributes"]["error.type"] == "RECORD_TOO_LARGE"
    polls = [s for s in spans if s["name"] == f"poll {topic}"]
    assert polls and all(s["kind"] == "CONSUMER" for s in polls)
    assert sum(s["attributes"]["messaging.batch.message_count"] for s in polls) == report["consumed"] == 6
    assert {s["attributes"]["messaging.consumer.group.name"] for s in polls} == {f"{topic}-g"}

    metrics = report["metrics"]
    assert metrics["messaging.client.sent.messages|messaging.operation.name=send"] == 6
    assert (
        metrics["messaging.client.sent.messages|error.type=RECORD_TOO_LARGE|messaging.operation.name=send"]
        == 1
    )
    assert metrics["messaging.client.consumed.messages|messaging.operation.name=poll"] == 6
    assert metrics["messaging.client.operation.duration|messaging.operation.name=send"] == 6
    assert (
        metrics[
            "messaging.client.operation.duration|error.type=RECORD_TOO_LARGE|messaging.operation.name=send"
        ]
        == 1
    )


def test_each_log_line_is_written_once(data_dir):
    log = (data_dir / "run" / "gateway-0.log").read_text()
    assert log.count("gateway serving on") == 1
