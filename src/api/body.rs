//! Request bodies, read whole before the handler runs: within a deadline and the size
//! limit. hyper bounds how long a request's head may take (`KEEL_HEADER_READ_TIMEOUT_SECS`)
//! but not its body, so without this a caller could trickle a body a byte at a time and hold
//! a connection and its task for as long as it liked. The deadline covers the whole body,
//! not the gap between two of its chunks (as tower-http's `TimeoutBody` does, which a byte a
//! second would never reach). Only identified callers (and the open routes) get this far:
//! a request refused before has its body never read.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::api::{ApiError, MAX_BODY_BYTES};

/// How request bodies are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRules {
    /// How long a body may take to arrive whole, from when its reading starts.
    pub(crate) read_timeout: Duration,
}

/// Reads the request's body whole, then hands the request on; refuses a body that is too
/// large (413) or does not arrive in time (408).
pub(crate) async fn read_whole(
    State(rules): State<BodyRules>,
    request: Request,
    next: Next,
) -> Response {
    match rules.buffered(request).await {
        Ok(request) => next.run(request).await,
        Err(error) => {
            // What is left of the body is never read: the connection cannot carry another
            // request.
            let mut response = error.into_response();
            let close = HeaderValue::from_static("close");
            response.headers_mut().insert(header::CONNECTION, close);
            response
        }
    }
}

impl BodyRules {
    /// The request with its body read into memory.
    async fn buffered(&self, request: Request) -> Result<Request, ApiError> {
        let (parts, body) = request.into_parts();
        let limit = MAX_BODY_BYTES;
        // A body announced too large is refused before a byte of it is read.
        if declared_length(&parts.headers).is_some_and(|length| length > limit as u64) {
            return Err(too_large(limit));
        }
        let bytes = tokio::time::timeout(self.read_timeout, collect(body, limit))
            .await
            .map_err(|_| ApiError::Invalid {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the request body did not arrive within {} s",
                    self.read_timeout.as_secs()
                ),
            })??;
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }
}

/// The `Content-Length` the request announces, when it has a readable one.
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The body's bytes, refused as soon as they pass `limit`.
async fn collect(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut chunks = body.into_data_stream();
    let mut collected = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|error| {
            ApiError::invalid(format!("the request body could not be read: {error}"))
        })?;
        if collected.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        collected.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(collected))
}

fn too_large(limit: usize) -> ApiError {
    ApiError::Invalid {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the request body is over the length limit of {limit} bytes"),
    }
}
