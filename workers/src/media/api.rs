//! Calls to a vendor's JSON API: authorization, timeouts and the mapping of HTTP failures to
//! outcomes. Only these requests carry the api key and the preset's headers.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, Method, Response, StatusCode, Url};
use serde_json::Value;
use tracing::Instrument;

use super::egress::{check_url, describe, guarded, refusal};
use super::{MediaContext, MediaErrorCode, MediaOutcome, MediaSpec, Step, cancellable};

/// Most of a vendor's error body read: only its start reaches the job's message.
const ERROR_BODY_MAX_BYTES: u64 = 64 * 1024;

pub(super) struct VendorApi<'a> {
    spec: &'a MediaSpec,
    client: Client,
}

impl<'a> VendorApi<'a> {
    pub(super) fn new(spec: &'a MediaSpec) -> Step<Self> {
        let allow_private = spec.limits.allow_private_addresses;
        let url = Url::parse(&spec.base_url).map_err(|_| {
            MediaOutcome::failed(
                MediaErrorCode::InvalidRequest,
                "the provider preset's base_url is not a valid URL",
            )
        })?;
        check_url(&url, allow_private).map_err(|why| address_refused(&why.0))?;
        let builder = Client::builder()
            .default_headers(auth_headers(spec)?)
            .timeout(spec.limits.request_timeout)
            // A redirect would carry the credentials to wherever the vendor points.
            .redirect(reqwest::redirect::Policy::none());
        let client = guarded(builder, allow_private).build().map_err(|error| {
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
            let body = read_capped(ctx, response, ERROR_BODY_MAX_BYTES).await?;
            let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
            return Err(status_error(status, retry_after, &body));
        }
        read_json(ctx, response, self.spec.limits.response_max_bytes).await
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

/// The body streamed up to `max` bytes; None when it is longer, so a vendor (or whatever
/// answers at its address) cannot make the worker buffer without bound.
async fn read_capped(
    ctx: &impl MediaContext,
    response: Response,
    max: u64,
) -> Step<Option<Vec<u8>>> {
    if response.content_length().is_some_and(|length| length > max) {
        return Ok(None);
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = cancellable(ctx, stream.next()).await? {
        let chunk = chunk.map_err(transport_error)?;
        if (body.len() + chunk.len()) as u64 > max {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

async fn read_json(ctx: &impl MediaContext, response: Response, max: u64) -> Step<Value> {
    let Some(body) = read_capped(ctx, response, max).await? else {
        return Err(MediaOutcome::failed(
            MediaErrorCode::ResponseTooLarge,
            format!(
                "the vendor's response is larger than {max} bytes (KEEL_MEDIA_RESPONSE_MAX_BYTES)"
            ),
        ));
    };
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

fn address_refused(why: &str) -> MediaOutcome {
    MediaOutcome::failed(
        MediaErrorCode::AddressRefused,
        format!("refused to call the vendor: {why} (KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES)"),
    )
}

pub(super) fn transport_error(error: reqwest::Error) -> MediaOutcome {
    if let Some(why) = refusal(&error) {
        return address_refused(&why.0);
    }
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
