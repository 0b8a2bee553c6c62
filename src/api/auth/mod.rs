//! Who may call the API: every request under `/v1` gets a [`Caller`] here or is refused.
//! Handlers take the caller as an extractor, so a route cannot forget to ask for it.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

use super::ApiError;
use crate::domain::Caller;

/// Identifies the caller of every request. Local mode without a runtime token: every
/// request is the `local` actor in the default workspace.
pub async fn identify(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Caller::local());
    next.run(request).await
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // `identify` runs before every handler; a request without a caller is a wiring bug,
        // and it fails closed.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::Internal("the request was not identified".into()))
    }
}
