//! Chat providers: one streaming model call over OpenAI chat completions, OpenAI responses
//! or Anthropic messages, translated to and from the provider-neutral conversation ([`Message`]).
//!
//! The wire types are a few serde structs of our own rather than a client crate: we need
//! both protocols, our own retries, timeouts, address filter and secret scrubbing, and
//! nothing else. SSE framing is `eventsource-stream` over reqwest's byte stream.
//!
//! Every error message leaving [`ChatClient::complete`] is scrubbed of the API key and the
//! secret header values: providers echo rejected keys back in their error bodies.

use std::time::{Duration, SystemTime};

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode, Url};
use serde_json::Value;

use super::{Message, ModelResponse, ProviderError, ToolCall, ToolSpec};
use crate::media::Secret;
use crate::media::egress::{check_url, describe, guarded, refusal};

mod anthropic;
mod openai;
mod responses;
mod retry;

pub use retry::{ChatModel, RetryPolicy, complete_with_retry};

/// Most of an error body read: only its start reaches the message.
const ERROR_BODY_MAX_BYTES: usize = 64 * 1024;
/// Most bytes one streamed response may take; far above any real answer's size, it only
/// stops whatever answers at the address from feeding the worker without end.
const STREAM_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Longest error message kept, in characters.
const MAX_MESSAGE_CHARS: usize = 500;

/// The wire protocol of a chat preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatApi {
    OpenAiCompletions,
    OpenAiResponses,
    AnthropicMessages,
}

/// Everything one provider's calls need, resolved from a preset (secrets included).
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub api: ChatApi,
    /// The preset's id, for errors and usage rows.
    pub provider: String,
    /// OpenAI style: `https://api.openai.com/v1`, calls go to `{base}/chat/completions`
    /// (`{base}/responses` for the Responses API).
    /// Anthropic: `https://api.anthropic.com`, calls go to `{base}/v1/messages` (a base
    /// already ending in `/v1` is taken as is).
    pub base_url: String,
    pub model: String,
    pub api_key: Option<Secret>,
    pub headers: Vec<(String, String)>,
    pub secret_headers: Vec<(String, Secret)>,
    /// The whole call: connecting, the headers and the full stream.
    pub request_timeout: Duration,
    /// The answer's length limit. OpenAI: sent as `max_tokens` only when set. Anthropic
    /// requires one: [`anthropic::DEFAULT_MAX_TOKENS`] when unset.
    pub max_tokens: Option<u32>,
    /// The task's reasoning effort (`minimal`, `low`, `medium`, `high`): OpenAI chat
    /// completions' `reasoning_effort`, the Responses API's `reasoning.effort`, Anthropic's
    /// extended thinking with a budget per effort (its signed thinking blocks then kept
    /// with each assistant turn and sent back).
    pub reasoning_effort: Option<String>,
    /// Lets calls reach loopback and private addresses: tests and on-premise relays.
    pub allow_private_addresses: bool,
}

/// A process's settings for chat calls; a preset's [`ProviderConfig`] takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatLimits {
    /// The whole call: connecting, the headers and the full stream.
    pub request_timeout: Duration,
    /// Lets calls reach loopback and private addresses: tests and on-premise models.
    pub allow_private_addresses: bool,
}

impl Default for ChatLimits {
    fn default() -> Self {
        ChatLimits {
            // Long answers of slow models stream for minutes.
            request_timeout: Duration::from_secs(600),
            allow_private_addresses: false,
        }
    }
}

/// A client for one provider preset. Cheap to share; holds one connection pool.
#[derive(Debug, Clone)]
pub struct ChatClient {
    config: ProviderConfig,
    url: Url,
    client: Client,
}

impl ChatClient {
    /// Checks the base URL (an IP literal that is not public is refused here, a name when
    /// it resolves) and builds the HTTP client with the preset's headers.
    pub fn new(config: ProviderConfig) -> Result<ChatClient, ProviderError> {
        let url = endpoint(&config)?;
        check_url(&url, config.allow_private_addresses)
            .map_err(|why| scrub(&config, address_refused(&why.0)))?;
        let builder = Client::builder()
            .default_headers(headers(&config).map_err(|e| scrub(&config, e))?)
            .timeout(config.request_timeout)
            // A redirect would carry the credentials wherever the provider points.
            .redirect(reqwest::redirect::Policy::none());
        let client = guarded(builder, config.allow_private_addresses)
            .build()
            .map_err(|error| {
                fatal(format!(
                    "cannot build the HTTP client: {}",
                    describe(&error)
                ))
            })?;
        Ok(ChatClient {
            config,
            url,
            client,
        })
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// One streaming call. `on_delta` receives assistant text as it arrives. Dropping the
    /// future closes the connection.
    pub async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ModelResponse, ProviderError> {
        let body = match self.config.api {
            ChatApi::OpenAiCompletions => openai::request(&self.config, messages, tools),
            ChatApi::OpenAiResponses => responses::request(&self.config, messages, tools),
            ChatApi::AnthropicMessages => anthropic::request(&self.config, messages, tools),
        };
        let span = tracing::info_span!(
            "model_call",
            otel.kind = "client",
            provider = %self.config.provider,
            server.address = self.url.host_str().unwrap_or_default(),
            http.response.status_code = tracing::field::Empty,
        );
        let result = tracing::Instrument::instrument(self.exchange(&body, on_delta), span).await;
        result.map_err(|error| scrub(&self.config, error))
    }

    async fn exchange(
        &self,
        body: &Value,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ModelResponse, ProviderError> {
        let response = self
            .client
            .post(self.url.clone())
            .json(body)
            .send()
            .await
            .map_err(transport_error)?;
        let status = response.status();
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        if !status.is_success() {
            return Err(self.status_error(response).await);
        }
        let mut assembler: Box<dyn Assemble> = match self.config.api {
            ChatApi::OpenAiCompletions => Box::<openai::Assembler>::default(),
            ChatApi::OpenAiResponses => Box::<responses::Assembler>::default(),
            ChatApi::AnthropicMessages => Box::<anthropic::Assembler>::default(),
        };
        let mut events = bounded(response.bytes_stream()).eventsource();
        while let Some(event) = events.next().await {
            if assembler.event(&event.map_err(stream_error)?, on_delta)? {
                return Ok(assembler.finish(&self.config.model));
            }
        }
        if assembler.complete_at_end() {
            return Ok(assembler.finish(&self.config.model));
        }
        Err(ProviderError::Transient {
            message: "the provider's stream ended before the response was complete".into(),
            retry_after: None,
        })
    }

    async fn status_error(&self, response: Response) -> ProviderError {
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let body = read_capped(response).await;
        let message = format!(
            "{} answered HTTP {}: {}",
            self.config.provider,
            status.as_u16(),
            error_message(&body)
        );
        if is_transient(status) {
            ProviderError::Transient {
                message,
                retry_after,
            }
        } else {
            ProviderError::Fatal {
                status: Some(status.as_u16()),
                message,
            }
        }
    }
}

/// What each protocol's stream reader does with the events of one response.
trait Assemble: Send {
    /// Takes one event; true when it completes the response.
    fn event(
        &mut self,
        event: &Event,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<bool, ProviderError>;
    /// Whether a stream that ends here (without its end marker) still holds a whole answer.
    fn complete_at_end(&self) -> bool;
    /// The response; `model` when the provider did not name the one that answered.
    fn finish(self: Box<Self>, model: &str) -> ModelResponse;
}

/// What the OpenAI protocols' readers gather from a stream: its text, the tool calls by
/// their position in the answer, and what it said of itself.
#[derive(Default)]
struct Collected {
    text: String,
    calls: std::collections::BTreeMap<usize, ToolCall>,
    finish_reason: Option<String>,
    usage: crate::agent::Usage,
    model: Option<String>,
}

impl Collected {
    /// The model the provider says answered, when it named one.
    fn answered_by(&mut self, model: Option<String>) {
        if let Some(model) = model.filter(|m| !m.is_empty()) {
            self.model = Some(model);
        }
    }

    /// Text as it streams: to `on_delta`, and kept.
    fn text(&mut self, text: &str, on_delta: &mut (dyn FnMut(&str) + Send)) {
        if !text.is_empty() {
            on_delta(text);
            self.text.push_str(text);
        }
    }

    /// The response; `model` when the provider did not name the one that answered.
    fn response(self, model: &str) -> ModelResponse {
        ModelResponse {
            message: Message::Assistant {
                content: (!self.text.is_empty()).then_some(self.text),
                tool_calls: self.calls.into_values().collect(),
                thinking: Vec::new(),
            },
            usage: self.usage,
            model: self.model.unwrap_or_else(|| model.to_string()),
            finish_reason: self.finish_reason,
        }
    }
}

fn endpoint(config: &ProviderConfig) -> Result<Url, ProviderError> {
    let base = config.base_url.trim_end_matches('/');
    let url = match config.api {
        ChatApi::OpenAiCompletions => format!("{base}/chat/completions"),
        ChatApi::OpenAiResponses => format!("{base}/responses"),
        ChatApi::AnthropicMessages => {
            format!("{}/v1/messages", base.strip_suffix("/v1").unwrap_or(base))
        }
    };
    Url::parse(&url).map_err(|_| {
        fatal(format!(
            "the base_url of {} is not a valid URL",
            config.provider
        ))
    })
}

fn headers(config: &ProviderConfig) -> Result<HeaderMap, ProviderError> {
    let mut headers = HeaderMap::new();
    if let Some(key) = &config.api_key {
        match config.api {
            ChatApi::OpenAiCompletions | ChatApi::OpenAiResponses => {
                let bearer = format!("Bearer {}", key.expose());
                headers.insert(AUTHORIZATION, sensitive(&bearer, "Authorization")?);
            }
            ChatApi::AnthropicMessages => {
                headers.insert("x-api-key", sensitive(key.expose(), "x-api-key")?);
            }
        }
    }
    if config.api == ChatApi::AnthropicMessages {
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(anthropic::VERSION),
        );
    }
    for (name, value) in &config.headers {
        let value = HeaderValue::from_str(value).map_err(|_| invalid_header(name))?;
        headers.insert(header_name(name)?, value);
    }
    for (name, value) in &config.secret_headers {
        headers.insert(header_name(name)?, sensitive(value.expose(), name)?);
    }
    Ok(headers)
}

fn sensitive(value: &str, name: &str) -> Result<HeaderValue, ProviderError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| invalid_header(name))?;
    value.set_sensitive(true);
    Ok(value)
}

fn header_name(name: &str) -> Result<HeaderName, ProviderError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid_header(name))
}

/// Names the header, never its value, which may be a secret.
fn invalid_header(name: &str) -> ProviderError {
    fatal(format!(
        "the preset's header {name:?} is not a valid HTTP header"
    ))
}

fn fatal(message: String) -> ProviderError {
    ProviderError::Fatal {
        status: None,
        message,
    }
}

fn address_refused(why: &str) -> ProviderError {
    fatal(format!(
        "refused to call the provider: {why} (allow private addresses for on-premise relays)"
    ))
}

/// 429, 408, 409 (a conflicting concurrent request) and 5xx pass; any other refusal is the
/// request's own fault.
fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
}

fn transport_error(error: reqwest::Error) -> ProviderError {
    if let Some(why) = refusal(&error) {
        return address_refused(&why.0);
    }
    let message = format!("the provider call failed: {}", describe(&error));
    if error.is_builder() {
        fatal(message)
    } else {
        // Connect errors, resets and timeouts.
        ProviderError::Transient {
            message,
            retry_after: None,
        }
    }
}

/// Why reading the stream stopped, before SSE framing.
#[derive(Debug)]
enum ReadError {
    Http(reqwest::Error),
    TooLarge,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Http(error) => f.write_str(&describe(error)),
            ReadError::TooLarge => write!(f, "the stream is larger than {STREAM_MAX_BYTES} bytes"),
        }
    }
}

/// The body's chunks, failing once they add up to more than [`STREAM_MAX_BYTES`].
fn bounded(
    stream: impl Stream<Item = reqwest::Result<bytes::Bytes>>,
) -> impl Stream<Item = Result<bytes::Bytes, ReadError>> {
    let mut total = 0;
    stream.map(move |chunk| {
        let chunk = chunk.map_err(ReadError::Http)?;
        total += chunk.len();
        if total > STREAM_MAX_BYTES {
            return Err(ReadError::TooLarge);
        }
        Ok(chunk)
    })
}

fn stream_error(error: EventStreamError<ReadError>) -> ProviderError {
    match error {
        EventStreamError::Transport(ReadError::Http(error)) => transport_error(error),
        EventStreamError::Transport(too_large @ ReadError::TooLarge) => {
            fatal(too_large.to_string())
        }
        unreadable => fatal(format!("the provider's stream is unreadable: {unreadable}")),
    }
}

/// A provider's error for an event in its stream (`{"error": {"type", "message"}}`).
fn stream_failure(error: &Value) -> ProviderError {
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("error");
    let message = format!("the provider failed mid-stream: {kind}: {}", text_of(error));
    // Anthropic's overloaded_error and api_error are its 529 and 500 arriving mid-stream.
    if matches!(kind, "overloaded_error" | "api_error" | "server_error") {
        ProviderError::Transient {
            message,
            retry_after: None,
        }
    } else {
        fatal(message)
    }
}

/// The body, up to [`ERROR_BODY_MAX_BYTES`] of it.
async fn read_capped(response: Response) -> String {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = ERROR_BODY_MAX_BYTES - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == ERROR_BODY_MAX_BYTES {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// `error.message` of an OpenAI or Anthropic error body, else the start of the body.
fn error_message(body: &str) -> String {
    const MAX_BODY_CHARS: usize = 300;
    match serde_json::from_str::<Value>(body) {
        Ok(value) if value.get("error").is_some() => text_of(&value["error"]),
        _ => body.chars().take(MAX_BODY_CHARS).collect(),
    }
}

fn text_of(error: &Value) -> String {
    match error.get("message").and_then(Value::as_str) {
        Some(message) => message.to_string(),
        None => error.to_string(),
    }
}

/// `retry-after-ms` (OpenAI), else `Retry-After` in seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = header(RETRY_AFTER.as_str())?;
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or_default())
}

/// The error with the preset's secrets replaced by `[redacted]`, and bounded.
fn scrub(config: &ProviderConfig, error: ProviderError) -> ProviderError {
    let clean = |message: String| {
        let secrets = config
            .api_key
            .iter()
            .chain(config.secret_headers.iter().map(|(_, value)| value))
            .map(Secret::expose)
            .filter(|value| !value.is_empty());
        let mut message = secrets.fold(message, |text, secret| text.replace(secret, "[redacted]"));
        if let Some((index, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
            message.truncate(index);
            message.push('…');
        }
        message
    };
    match error {
        ProviderError::Transient {
            message,
            retry_after,
        } => ProviderError::Transient {
            message: clean(message),
            retry_after,
        },
        ProviderError::Fatal { status, message } => ProviderError::Fatal {
            status,
            message: clean(message),
        },
        ProviderError::Interrupted => ProviderError::Interrupted,
    }
}

#[cfg(test)]
mod tests;
