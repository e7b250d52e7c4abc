"""W3C trace context (and baggage) in gRPC metadata: inject, extract, round trip."""

from __future__ import annotations

import re

from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from services.telemetry import extract_context, inject_metadata

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def remote_context(sampled: bool = True, state: TraceState | None = None):
    span_context = SpanContext(
        TRACE_ID,
        SPAN_ID,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else 0),
        trace_state=state or TraceState(),
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def test_inject_writes_a_w3c_traceparent_and_keeps_existing_metadata():
    metadata = inject_metadata([("x-tributary-forwarded-by", "c1")], ctx=remote_context())
    assert metadata[0] == ("x-tributary-forwarded-by", "c1")
    headers = dict(metadata)
    assert headers["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]", headers["traceparent"])


def test_unsampled_flag_travels_too():
    headers = dict(inject_metadata(ctx=remote_context(sampled=False)))
    assert headers["traceparent"].endswith("-00")


def test_round_trip_gives_the_remote_parent():
    state = TraceState([("vendor", "value")])
    metadata = inject_metadata(ctx=remote_context(state=state))
    extracted = trace.get_current_span(extract_context(metadata)).get_span_context()
    assert extracted.trace_id == TRACE_ID and extracted.span_id == SPAN_ID
    assert extracted.is_remote and extracted.trace_flags.sampled
    assert extracted.trace_state.get("vendor") == "value"


def test_extract_accepts_bytes_values_and_grpc_metadatum_tuples():
    headers = dict(inject_metadata(ctx=remote_context()))
    metadata = (("user-agent", "grpc-python"), ("traceparent", headers["traceparent"].encode()))
    extracted = trace.get_current_span(extract_context(metadata)).get_span_context()
    assert extracted.trace_id == TRACE_ID


def test_nothing_to_inject_without_a_span_and_nothing_extracted_from_nothing():
    assert inject_metadata([("a", "1")], ctx=context.Context()) == [("a", "1")]
    assert not trace.get_current_span(extract_context(None)).get_span_context().is_valid
    assert (
        not trace.get_current_span(extract_context([("traceparent", "garbage")])).get_span_context().is_valid
    )


def test_extract_never_inherits_the_callers_current_span():
    """A server task may run in a context where some span is current (in-process tests, a span
    leaked into a task): a request without trace headers must still start a new trace."""
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("leaked"):
        assert not trace.get_current_span(extract_context([])).get_span_context().is_valid


def test_current_context_is_injected_by_default_and_baggage_travels():
    tracer = TracerProvider().get_tracer("test")
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("client") as span:
            metadata = inject_metadata()
    finally:
        context.detach(token)
    headers = dict(metadata)
    assert f"{span.get_span_context().span_id:016x}" in headers["traceparent"]
    assert headers["baggage"] == "tenant=acme"
    assert baggage.get_baggage("tenant", extract_context(metadata)) == "acme"
