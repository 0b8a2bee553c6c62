//! W3C trace context across process boundaries: an incoming `traceparent` header makes the
//! request span a child of the caller's span, and the queue row carries the enqueueing
//! span's `traceparent` to the worker that claims it.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of the current span, when it belongs to an exported trace.
pub fn current_traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` (not yet entered) a child of the remote span `traceparent` names; a missing
/// or malformed value leaves it a root.
pub fn set_remote_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        // Fails only without the OpenTelemetry layer, when there is no trace to join.
        let _ = span.set_parent(context);
    }
}

/// The trace id of `span`, when it belongs to an exported trace.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}
