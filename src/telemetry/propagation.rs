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
pub(crate) fn current_traceparent() -> Option<String> {
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
pub(crate) fn set_remote_parent(span: &tracing::Span, traceparent: Option<&str>) {
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
pub(crate) fn trace_id(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn traced<T>(f: impl FnOnce() -> T) -> T {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f)
    }

    #[test]
    fn a_remote_parent_is_carried_to_the_next_hop() {
        let (traceparent, trace) = traced(|| {
            let span = tracing::info_span!("request");
            set_remote_parent(&span, Some(&format!("00-{TRACE}-00f067aa0ba902b7-01")));
            let traceparent = span.in_scope(current_traceparent).unwrap();
            (traceparent, trace_id(&span))
        });
        assert_eq!(trace.as_deref(), Some(TRACE));
        assert!(
            traceparent.starts_with(&format!("00-{TRACE}-")),
            "{traceparent}"
        );
        assert!(
            !traceparent.contains("00f067aa0ba902b7"),
            "the next hop's parent is this span"
        );
    }

    #[test]
    fn malformed_or_untraced_contexts_are_ignored() {
        let traceparent = traced(|| {
            let span = tracing::info_span!("request");
            set_remote_parent(&span, Some("00-garbage"));
            span.in_scope(current_traceparent)
        });
        assert!(traceparent.is_some(), "a root span still starts a trace");
        assert_eq!(current_traceparent(), None, "no trace without the layer");
    }
}
