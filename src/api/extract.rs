//! Extractors whose rejections speak the error envelope.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// `Json<T>` that answers malformed JSON, unknown fields, wrong types and oversized bodies
/// with the envelope (400, 413, 415, 422), naming what was wrong.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let message = match &rejection {
        JsonRejection::JsonDataError(e) => format!("invalid JSON body: {}", source_text(e)),
        JsonRejection::JsonSyntaxError(e) => format!("malformed JSON body: {}", source_text(e)),
        JsonRejection::MissingJsonContentType(_) => {
            "expected a JSON body with 'Content-Type: application/json'".to_string()
        }
        other => other.body_text(),
    };
    ApiError::Invalid { status, message }
}

/// serde's message ("unknown field `x`, expected one of …") without axum's prefix.
fn source_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text = inner.to_string();
        source = inner.source();
    }
    text
}

/// `Query<T>` with envelope rejections.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::invalid(
                format!("invalid query string: {}", source_text(&e)),
            )),
            Err(other) => Err(ApiError::invalid(other.body_text())),
        }
    }
}

/// An optional JSON body: absent or empty gives `T::default()`; otherwise as [`ApiJson`].
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::Invalid {
                status: e.status(),
                message: e.body_text(),
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(OptionalJson)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}
