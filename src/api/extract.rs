//! Extractors whose rejections speak the error envelope.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::api::error::ApiError;

/// `Json<T>` that answers malformed JSON, unknown fields, wrong types and oversized bodies
/// with the envelope (400, 413, 415, 422), naming what was wrong. An integer field also
/// takes an integral number written with a fraction or an exponent (`3.0`, `1e3`): JSON
/// Schema calls those integers, so a client generated from the document may send them.
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(bytes_rejection)?;
        let req = Request::from_parts(parts, Body::from(bytes.clone()));
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(JsonRejection::JsonDataError(error)) => with_integers(&bytes)
                .map(ApiJson)
                .ok_or_else(|| json_rejection(JsonRejection::JsonDataError(error))),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// The body read again with every integral number as an integer, when it had any to
/// rewrite and then fits `T`; the first reading's error stands otherwise, since it names
/// the line and column.
fn with_integers<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if !integral_to_integer(&mut value) {
        return None;
    }
    serde_json::from_value(value).ok()
}

/// Rewrites `3.0` as `3` throughout (within the range of an i64); whether it changed
/// anything.
fn integral_to_integer(value: &mut serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            match n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18) {
                Some(f) => {
                    *value = serde_json::Value::from(f as i64);
                    true
                }
                None => false,
            }
        }
        serde_json::Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, v| integral_to_integer(v) | changed),
        serde_json::Value::Object(map) => map
            .values_mut()
            .fold(false, |changed, v| integral_to_integer(v) | changed),
        _ => false,
    }
}

fn bytes_rejection(rejection: BytesRejection) -> ApiError {
    ApiError::Invalid {
        status: rejection.status(),
        message: rejection.body_text(),
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

/// Whether the request says its body is JSON (`application/json` or `application/*+json`),
/// as axum's `Json` asks.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"))
}

/// `Query<T>` with envelope rejections.
pub(crate) struct ApiQuery<T>(pub(crate) T);

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

/// An optional JSON body: absent or empty gives `T::default()`; otherwise as [`ApiJson`],
/// `Content-Type: application/json` included (415 without it), so a web page's
/// `text/plain` form post, which a browser sends without asking, is no body at all.
pub(crate) struct OptionalJson<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = json_content_type(req.headers());
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(bytes_rejection)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        if !json {
            return Err(ApiError::Invalid {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                message: "expected a JSON body with 'Content-Type: application/json'".into(),
            });
        }
        if bytes.trim_ascii() == b"null" {
            return Ok(OptionalJson(T::default()));
        }
        match serde_json::from_slice(&bytes) {
            Ok(value) => Ok(OptionalJson(value)),
            Err(error) => with_integers(&bytes)
                .map(OptionalJson)
                .ok_or_else(|| ApiError::invalid(format!("invalid JSON body: {error}"))),
        }
    }
}
