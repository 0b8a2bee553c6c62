//! Request id, the request span and duration metric, error logging, the bound on a
//! handler's time, and the envelope for responses no handler produced.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::api::error::{ApiError, ErrorDetail};
use crate::telemetry;

const REQUEST_ID: &str = "x-request-id";
const TRACEPARENT: &str = "traceparent";
/// The longest a handler may take to produce its response's head (an SSE stream's body
/// goes on after it), counted once the request's body has arrived. Past the
/// connection-acquire timeout and the longest outside call a handler makes (a live
/// provider check, 10 s), so only a database that stopped answering mid-request reaches
/// it, and the request gets a 503 instead of hanging.
const RESPONSE_BOUND: std::time::Duration =
    crate::db::ACQUIRE_TIMEOUT.saturating_add(std::time::Duration::from_secs(20));
/// Error bodies are small; anything larger is passed through untouched.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Gives every request an id (the client's `X-Request-Id` when it is sane) and runs it in
/// a span (a child of the caller's span when a `traceparent` header names one), records its
/// duration, logs errors with their internal detail, and writes the request id and trace id
/// into error envelopes.
pub(crate) async fn request_context(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| crate::domain::new_id("req"));
    let method = request.method().clone();
    // Unmatched paths share one label, so a scan cannot explode the metric's cardinality.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let span = tracing::info_span!(
        "http",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        path = %request.uri().path(),
        %request_id,
        // Recorded by the auth layer once it knows the caller; never a credential.
        actor = tracing::field::Empty,
        workspace = tracing::field::Empty,
    );
    let traceparent = request
        .headers()
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    telemetry::set_remote_parent(&span, traceparent);
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    // Client errors are the client's: only a server error marks the span failed.
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    if let Some(detail) = response.extensions().get::<ErrorDetail>() {
        span.in_scope(|| {
            if status.is_server_error() {
                tracing::error!(%status, error = %detail.0, "request failed");
            } else {
                tracing::debug!(%status, error = %detail.0, "request refused");
            }
        });
        let ids = [
            ("request_id", Some(request_id.clone())),
            ("trace_id", telemetry::trace_id(&span)),
        ];
        response = with_ids(response, &ids).await;
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    telemetry::metrics::http_request(method.as_str(), &route, status.as_u16(), started.elapsed());
    response
}

/// Runs the handler within [`RESPONSE_BOUND`], or answers 503.
pub(crate) async fn respond_within_bound(request: Request, next: Next) -> Response {
    match tokio::time::timeout(RESPONSE_BOUND, next.run(request)).await {
        Ok(response) => response,
        // Only a database that does not answer keeps a handler this long (each connection
        // request gives up after ACQUIRE_TIMEOUT, but a statement on a connection that
        // hangs has no bound of its own). Dropped, the handler's open transaction rolls
        // back: its writes land whole or not at all.
        Err(_) => {
            ApiError::Unavailable(format!("no response within {RESPONSE_BOUND:?}")).into_response()
        }
    }
}

/// Adds the present `ids` to the error envelope.
async fn with_ids(response: Response, ids: &[(&str, Option<String>)]) -> Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let mut value: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        Err(_) => return Response::from_parts(parts, Body::from(bytes)),
    };
    if let Some(error) = value.get_mut("error").and_then(|e| e.as_object_mut()) {
        for (name, id) in ids {
            if let Some(id) = id {
                error.insert((*name).into(), id.as_str().into());
            }
        }
    }
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(value.to_string()))
}

pub(crate) async fn not_found(request: Request) -> ApiError {
    ApiError::NotFound(format!(
        "route {} {}",
        request.method(),
        request.uri().path()
    ))
}

pub(crate) async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::method_not_allowed(request.method(), request.uri().path())
}

pub(crate) fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into());
    ApiError::Internal(format!("handler panicked: {detail}")).into_response()
}
