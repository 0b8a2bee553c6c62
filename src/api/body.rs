//! Request bodies, read whole before the handler runs: within a deadline and the size
//! limit, which for an operation that takes no body (a cancel, a check, a delete) is zero,
//! so a body sent to one is refused rather than ignored. hyper bounds how long a request's
//! head may take (`KEEL_HEADER_READ_TIMEOUT_SECS`) but not its body, so without this a
//! caller could trickle a body a byte at a time and hold a connection and its task for as
//! long as it liked. The deadline covers the whole body, not the gap between two of its
//! chunks (as tower-http's `TimeoutBody` does, which a byte a second would never reach).
//! Only identified callers (and the open routes) get this far: a request refused before
//! has its body never read.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::api::{ApiError, MAX_BODY_BYTES};

/// The routes outside the OpenAPI document that take a body: the console's sign-in (the
/// token or a sign-in code, as JSON or a form). Its other routes take none.
const UNDOCUMENTED_WITH_BODY: [(Method, &str); 1] = [(Method::POST, "/console/session")];

/// How request bodies are read.
pub(crate) struct BodyRules {
    /// How long a body may take to arrive whole, from when its reading starts.
    read_timeout: Duration,
    /// The routes that take a body (method, path template); every other route takes none.
    with_body: HashSet<(Method, String)>,
}

/// What a route takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// A body of up to [`MAX_BODY_BYTES`].
    Body,
    Nothing,
}

/// Reads the request's body whole, then hands the request on; refuses a body that is too
/// large or sent to a route that takes none (413), or that does not arrive in time (408).
pub(crate) async fn read_whole(
    State(rules): State<Arc<BodyRules>>,
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
    /// The rules of a router whose documented operations `document` describes: those with
    /// a request body (optional or not) take one.
    pub(crate) fn new(read_timeout: Duration, document: &utoipa::openapi::OpenApi) -> BodyRules {
        let documented = crate::api::openapi::operations_with_body(document);
        let undocumented = UNDOCUMENTED_WITH_BODY.map(|(method, path)| (method, path.into()));
        BodyRules {
            read_timeout,
            with_body: documented.into_iter().chain(undocumented).collect(),
        }
    }

    /// What the request's route takes. An unmatched path is answered 404 whatever it
    /// sends, after a body read as any route's.
    fn takes(&self, request: &Request) -> Takes {
        let Some(path) = request.extensions().get::<MatchedPath>() else {
            return Takes::Body;
        };
        let route = (request.method().clone(), path.as_str().to_string());
        match self.with_body.contains(&route) {
            true => Takes::Body,
            false => Takes::Nothing,
        }
    }

    /// The request with its body read into memory.
    async fn buffered(&self, request: Request) -> Result<Request, ApiError> {
        let takes = self.takes(&request);
        let (parts, body) = request.into_parts();
        // A body announced too large is refused before a byte of it is read.
        if declared_length(&parts.headers).is_some_and(|length| length > takes.limit() as u64) {
            return Err(takes.refusal());
        }
        let bytes = tokio::time::timeout(self.read_timeout, collect(body, takes))
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

/// The body's bytes, refused as soon as they pass what the route takes.
async fn collect(body: Body, takes: Takes) -> Result<Bytes, ApiError> {
    let mut chunks = body.into_data_stream();
    let mut collected = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|error| {
            ApiError::invalid(format!("the request body could not be read: {error}"))
        })?;
        if collected.len() + chunk.len() > takes.limit() {
            return Err(takes.refusal());
        }
        collected.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(collected))
}

impl Takes {
    /// The most bytes of body the route takes.
    fn limit(self) -> usize {
        match self {
            Takes::Body => MAX_BODY_BYTES,
            Takes::Nothing => 0,
        }
    }

    /// Why a body past [`Takes::limit`] is refused: it is too large either way (413).
    fn refusal(self) -> ApiError {
        let message = match self {
            Takes::Body => {
                format!("the request body is over the length limit of {MAX_BODY_BYTES} bytes")
            }
            Takes::Nothing => "this operation takes no request body; send none".into(),
        };
        ApiError::Invalid {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message,
        }
    }
}
