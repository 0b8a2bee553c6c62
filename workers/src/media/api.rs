//! Calls to a vendor's JSON API: authorization, timeouts and the mapping of HTTP failures to
//! outcomes. Only these requests carry the api key and the preset's headers.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, Method, Response, StatusCode};
use serde_json::Value;
use tracing::Instrument;

use super::{MediaContext, MediaErrorCode, MediaOutcome, MediaSpec, Step, cancellable};

pub(super) struct VendorApi<'a> {
    spec: &'a MediaSpec,
    client: Client,
}

impl<'a> VendorApi<'a> {
    pub(super) fn new(spec: &'a MediaSpec) -> Step<Self> {
        let client = Client::builder()
            .default_headers(auth_headers(spec)?)
            .timeout(spec.limits.request_timeout)
            // A redirect would carry the credentials to wherever the vendor points.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| {
                MediaOutcome::failed(
                    MediaErrorCode::InvalidRequest,
                    format!("cannot build the vendor client: {}", describe(&error)),
                )
            })?;
        Ok(VendorApi { spec, client })
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.spec.base_url.trim_end_matches('/'))
    }

    pub(super) async fn post(
        &self,
        ctx: &impl MediaContext,
        path: &str,
        body: &Value,
    ) -> Step<Value> {
        let request = self.client.request(Method::POST, self.url(path)).json(body);
        self.call(ctx, request).await
    }

    pub(super) async fn get(&self, ctx: &impl MediaContext, path: &str) -> Step<Value> {
        self.call(ctx, self.client.get(self.url(path))).await
    }

    async fn call(&self, ctx: &impl MediaContext, request: reqwest::RequestBuilder) -> Step<Value> {
        let request = request.build().map_err(transport_error)?;
        let span = vendor_span(request.method(), request.url(), true);
        let response = cancellable(ctx, self.client.execute(request))
            .instrument(span.clone())
            .await?
            .map_err(transport_error)?;
        let status = response.status();
        span.record("http.response.status_code", status.as_u16());
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let body = cancellable(ctx, response.text()).await?.unwrap_or_default();
            return Err(status_error(status, retry_after, &body));
        }
        read_json(ctx, response).await
    }
}

/// A client span for one vendor HTTP call, a child of the job's span: the method, the
/// host and (for a vendor API, whose paths name operations and task ids) the path; never
/// the query, headers or body, which may carry credentials or signed tokens. The caller
/// records the answer's status.
pub(super) fn vendor_span(method: &Method, url: &reqwest::Url, with_path: bool) -> tracing::Span {
    tracing::info_span!(
        "vendor_call",
        otel.kind = "client",
        http.request.method = %method,
        server.address = url.host_str().unwrap_or_default(),
        url.path = if with_path { url.path() } else { "" },
        http.response.status_code = tracing::field::Empty,
    )
}

async fn read_json(ctx: &impl MediaContext, response: Response) -> Step<Value> {
    let body = cancellable(ctx, response.bytes())
        .await?
        .map_err(transport_error)?;
    serde_json::from_slice(&body).map_err(|error| {
        MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            format!("the vendor answered with invalid JSON: {error}"),
        )
    })
}

fn auth_headers(spec: &MediaSpec) -> Step<HeaderMap> {
    let mut headers = HeaderMap::new();
    let bearer = format!("Bearer {}", spec.api_key.expose());
    headers.insert(AUTHORIZATION, sensitive(&bearer, "Authorization")?);
    for (name, value) in &spec.headers {
        let value = HeaderValue::from_str(value).map_err(|_| invalid_header(name))?;
        headers.insert(header_name(name)?, value);
    }
    for (name, value) in &spec.secret_headers {
        headers.insert(header_name(name)?, sensitive(value.expose(), name)?);
    }
    Ok(headers)
}

fn sensitive(value: &str, name: &str) -> Step<HeaderValue> {
    let mut value = HeaderValue::from_str(value).map_err(|_| invalid_header(name))?;
    value.set_sensitive(true);
    Ok(value)
}

fn header_name(name: &str) -> Step<HeaderName> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid_header(name))
}

/// Names the header but never its value, which may be a secret.
fn invalid_header(name: &str) -> MediaOutcome {
    MediaOutcome::failed(
        MediaErrorCode::InvalidRequest,
        format!("the provider preset's header {name:?} is not a valid HTTP header"),
    )
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

fn status_error(status: StatusCode, retry_after: Option<Duration>, body: &str) -> MediaOutcome {
    let message = format!(
        "vendor returned HTTP {}: {}",
        status.as_u16(),
        vendor_message(body)
    );
    match status.as_u16() {
        401 | 403 => MediaOutcome::failed(MediaErrorCode::AuthFailed, message),
        429 => MediaOutcome::Retry {
            code: MediaErrorCode::RateLimited,
            message,
            after: retry_after,
        },
        408 => MediaOutcome::retry(MediaErrorCode::Timeout, message),
        500..=599 => MediaOutcome::retry(MediaErrorCode::ProviderUnavailable, message),
        400..=499 => MediaOutcome::failed(MediaErrorCode::InvalidRequest, message),
        _ => MediaOutcome::failed(MediaErrorCode::ProviderError, message),
    }
}

/// The human part of an OpenAI- or Ark-style error body (`{"error": {"code", "message"}}`),
/// else the start of the raw body.
pub(super) fn vendor_message(body: &str) -> String {
    const MAX_BODY_CHARS: usize = 300;
    let parsed = serde_json::from_str::<Value>(body).ok();
    let error = parsed.as_ref().and_then(|value| value.get("error"));
    match error {
        Some(error) => error_text(error),
        None => body.chars().take(MAX_BODY_CHARS).collect(),
    }
}

/// `code: message` from a vendor error object, or the value itself when it is a string.
pub(super) fn error_text(error: &Value) -> String {
    if let Some(text) = error.as_str() {
        return text.to_string();
    }
    let message = error.get("message").and_then(Value::as_str).unwrap_or("");
    match error.get("code").and_then(Value::as_str) {
        Some(code) if !message.is_empty() => format!("{code}: {message}"),
        Some(code) => code.to_string(),
        None => message.to_string(),
    }
}

pub(super) fn transport_error(error: reqwest::Error) -> MediaOutcome {
    let message = format!("vendor request failed: {}", describe(&error));
    if error.is_builder() {
        // The preset's base URL is unusable; no retry will change that.
        MediaOutcome::failed(MediaErrorCode::InvalidRequest, message)
    } else if error.is_timeout() {
        MediaOutcome::retry(MediaErrorCode::Timeout, message)
    } else {
        MediaOutcome::retry(MediaErrorCode::ProviderUnavailable, message)
    }
}

/// reqwest's own message is terse ("error sending request"); the cause is in its sources.
pub(super) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
