//! Request id, error logging and the envelope for responses no handler produced.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::error::{ApiError, ErrorDetail};

const REQUEST_ID: &str = "x-request-id";
/// Error bodies are small; anything larger is passed through untouched.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Gives every request an id (the client's `X-Request-Id` when it is sane), runs it in a
/// span, logs errors with their internal detail, and writes the id into error envelopes.
pub async fn request_context(request: Request, next: Next) -> Response {
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| crate::domain::new_id("req"));
    let span = tracing::info_span!("http", method = %request.method(), path = %request.uri().path(), %request_id);
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Some(detail) = response.extensions().get::<ErrorDetail>() {
        let status = response.status();
        span.in_scope(|| {
            if status.is_server_error() {
                tracing::error!(%status, error = %detail.0, "request failed");
            } else {
                tracing::debug!(%status, error = %detail.0, "request refused");
            }
        });
        response = with_request_id(response, &request_id).await;
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

async fn with_request_id(response: Response, request_id: &str) -> Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let mut value: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        Err(_) => return Response::from_parts(parts, Body::from(bytes)),
    };
    if let Some(error) = value.get_mut("error").and_then(|e| e.as_object_mut()) {
        error.insert("request_id".into(), request_id.into());
    }
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(value.to_string()))
}

pub async fn not_found(request: Request) -> ApiError {
    ApiError::NotFound(format!(
        "route {} {}",
        request.method(),
        request.uri().path()
    ))
}

pub async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::Invalid {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!(
            "method {} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    }
}

pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into());
    ApiError::Internal(format!("handler panicked: {detail}")).into_response()
}
