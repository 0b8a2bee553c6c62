//! A scripted fake LLM on `127.0.0.1:0` speaking both chat protocols Keel calls, streaming:
//! OpenAI chat completions (`POST /v1/chat/completions`, preset `base_url` =
//! [`FakeLlm::openai_base`]) and Anthropic messages (`POST /v1/messages`, preset `base_url` =
//! [`FakeLlm::anthropic_base`]).
//!
//! Each request takes the next [`Turn`] of the script, whichever protocol it speaks, and
//! answers it as real SSE: several `data:` chunks per turn, text split across chunks, each
//! tool call's arguments split across chunks, usage at the end. Every request body is
//! recorded ([`FakeLlm::requests`]), and a turn whose whole stream was written counts as
//! completed ([`FakeLlm::completed`]): a client that hangs up mid-stream (a killed worker, a
//! cancelled call) leaves its turn uncounted.
//!
//! ```ignore
//! let llm = FakeLlm::start(vec![
//!     Turn::tool_call("call_1", "read_file", r#"{"path":"README.md"}"#),
//!     Turn::error(429, "slow down").retry_after("1"),
//!     Turn::text("All done.").usage(120, 8, 100),
//! ])
//! .await
//! .require_key("sk-test");
//! // ... point a preset at llm.openai_base(), run, then:
//! assert_eq!(llm.completed(), 2);
//! let second = &llm.requests()[1].body; // the conversation the model saw
//! ```
//!
//! When the script runs out the fake answers 400 `fake llm: script exhausted`, a fatal
//! error, so a loop that calls once too often fails loudly instead of hanging.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Which protocol a request spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    OpenAi,
    /// OpenAI's Responses API.
    Responses,
    Anthropic,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Request {
    pub protocol: Protocol,
    /// Lowercase header names.
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The conversation sent: OpenAI's `messages` (system included), Anthropic's `messages`
    /// (the system prompt is `body["system"]`).
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// One scripted answer. Build with [`Turn::text`], [`Turn::tool_call`] or [`Turn::error`]
/// and refine with the chained setters.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Anthropic only: a thinking block (its text, its signature) before the rest.
    thinking: Option<(String, String)>,
    text: Option<String>,
    tool_calls: Vec<(String, String, String)>,
    /// prompt (cached included), completion, cached.
    usage: (u64, u64, u64),
    error: Option<Failure>,
    delay: Duration,
    hold: Option<CancellationToken>,
    reset: bool,
}

#[derive(Debug, Clone)]
struct Failure {
    status: u16,
    message: String,
    retry_after: Option<String>,
    retry_after_ms: Option<String>,
}

impl Turn {
    fn empty() -> Turn {
        Turn {
            thinking: None,
            text: None,
            tool_calls: Vec::new(),
            usage: (10, 5, 0),
            error: None,
            delay: Duration::ZERO,
            hold: None,
            reset: false,
        }
    }

    /// An assistant message with this text (finish reason `stop` unless tool calls follow).
    pub fn text(text: &str) -> Turn {
        Turn {
            text: Some(text.to_string()),
            ..Turn::empty()
        }
    }

    /// An assistant message asking for one tool call; `arguments` is the JSON text.
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> Turn {
        Turn::empty().and_tool_call(id, name, arguments)
    }

    /// Anthropic only: the message starts with a thinking block of this text, signed.
    pub fn thinking(mut self, text: &str, signature: &str) -> Turn {
        self.thinking = Some((text.to_string(), signature.to_string()));
        self
    }

    /// One more tool call in the same message (parallel calls), or text + a call.
    pub fn and_tool_call(mut self, id: &str, name: &str, arguments: &str) -> Turn {
        self.tool_calls
            .push((id.to_string(), name.to_string(), arguments.to_string()));
        self
    }

    /// Prompt tokens (cached ones included), completion tokens, cached prompt tokens.
    /// Default 10, 5, 0. Anthropic reports `input_tokens = prompt - cached` and
    /// `cache_read_input_tokens = cached`, as the real API does.
    pub fn usage(mut self, prompt: u64, completion: u64, cached: u64) -> Turn {
        self.usage = (prompt, completion, cached);
        self
    }

    /// An HTTP error instead of a stream, with the protocol's error body
    /// (`{"error":{"message":...}}`).
    pub fn error(status: u16, message: &str) -> Turn {
        Turn {
            error: Some(Failure {
                status,
                message: message.to_string(),
                retry_after: None,
                retry_after_ms: None,
            }),
            ..Turn::empty()
        }
    }

    /// The error's `Retry-After` header value (seconds or an HTTP date).
    pub fn retry_after(mut self, value: &str) -> Turn {
        if let Some(failure) = &mut self.error {
            failure.retry_after = Some(value.to_string());
        }
        self
    }

    /// The error's `retry-after-ms` header value.
    #[allow(
        dead_code,
        reason = "keel-workers' provider tests use it; they include this file"
    )]
    pub fn retry_after_ms(mut self, value: &str) -> Turn {
        if let Some(failure) = &mut self.error {
            failure.retry_after_ms = Some(value.to_string());
        }
        self
    }

    /// Waits this long before answering (before any header).
    #[allow(
        dead_code,
        reason = "keel-workers' provider tests use it; they include this file"
    )]
    pub fn delay(mut self, delay: Duration) -> Turn {
        self.delay = delay;
        self
    }

    /// Holds the turn mid-stream until `release` is cancelled: the status, headers and
    /// the chunks up to the first piece of text (or the first chunk, without text) are
    /// sent, the rest waits. An error turn is held before it answers. Use it to act while
    /// a call is in flight (the client has seen a delta by then).
    pub fn hold(mut self, release: CancellationToken) -> Turn {
        self.hold = Some(release);
        self
    }

    /// Aborts the connection mid-stream, after the chunk with the first piece of text (or
    /// the first chunk): a reset the client should retry. The turn never completes.
    #[allow(
        dead_code,
        reason = "keel-workers' provider tests use it; they include this file"
    )]
    pub fn reset_mid_stream(mut self) -> Turn {
        self.reset = true;
        self
    }
}

struct Shared {
    script: Mutex<VecDeque<Turn>>,
    requests: Mutex<Vec<Request>>,
    completed: AtomicUsize,
    api_key: Mutex<Option<String>>,
    next_id: AtomicUsize,
}

/// The running fake; shut down when dropped.
pub struct FakeLlm {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl FakeLlm {
    pub async fn start(script: Vec<Turn>) -> FakeLlm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            script: Mutex::new(script.into()),
            requests: Mutex::new(Vec::new()),
            completed: AtomicUsize::new(0),
            api_key: Mutex::new(None),
            next_id: AtomicUsize::new(1),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/responses", post(responses))
            .route("/v1/messages", post(anthropic))
            .with_state(shared.clone());
        let shutdown = CancellationToken::new();
        tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        );
        FakeLlm {
            url,
            shared,
            shutdown,
        }
    }

    /// Answers 401 unless OpenAI requests carry `Authorization: Bearer <key>` and Anthropic
    /// ones `x-api-key: <key>`.
    pub fn require_key(self, key: &str) -> FakeLlm {
        *self.shared.api_key.lock().unwrap() = Some(key.to_string());
        self
    }

    /// The `base_url` of an `openai-completions` or `openai-responses` preset (`{url}/v1`).
    pub fn openai_base(&self) -> String {
        format!("{}/v1", self.url)
    }

    /// The `base_url` of an `anthropic-messages` preset (`{url}`).
    pub fn anthropic_base(&self) -> String {
        self.url.clone()
    }

    /// Appends turns to the script.
    pub fn push(&self, turns: impl IntoIterator<Item = Turn>) {
        self.shared.script.lock().unwrap().extend(turns);
    }

    /// Every request received so far, in arrival order (error answers included).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Turns whose whole stream was written to the client.
    pub fn completed(&self) -> usize {
        self.shared.completed.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests have arrived; panics after `timeout`.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) {
        self.wait(
            timeout,
            || self.shared.requests.lock().unwrap().len() >= n,
            "requests",
            n,
        )
        .await;
    }

    /// Waits until at least `n` turns completed; panics after `timeout`.
    pub async fn wait_for_completed(&self, n: usize, timeout: Duration) {
        self.wait(timeout, || self.completed() >= n, "completed turns", n)
            .await;
    }

    async fn wait(&self, timeout: Duration, done: impl Fn() -> bool, what: &str, n: usize) {
        let deadline = Instant::now() + timeout;
        while !done() {
            assert!(
                Instant::now() < deadline,
                "fake llm: fewer than {n} {what} after {timeout:?} (requests: {}, completed: {})",
                self.shared.requests.lock().unwrap().len(),
                self.completed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn openai(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Protocol::OpenAi, &headers, &body).await
}

async fn responses(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Protocol::Responses, &headers, &body).await
}

async fn anthropic(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&shared, Protocol::Anthropic, &headers, &body).await
}

async fn answer(
    shared: &Arc<Shared>,
    protocol: Protocol,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return error_response(protocol, &failure(400, "fake llm: body is not JSON"));
    };
    shared.requests.lock().unwrap().push(Request {
        protocol,
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: body.clone(),
    });
    let expected = shared.api_key.lock().unwrap().clone();
    if let Some(key) = expected {
        let (name, value) = match protocol {
            Protocol::OpenAi | Protocol::Responses => ("authorization", format!("Bearer {key}")),
            Protocol::Anthropic => ("x-api-key", key),
        };
        if headers.get(name).and_then(|v| v.to_str().ok()) != Some(value.as_str()) {
            return error_response(
                protocol,
                &failure(401, "fake llm: wrong or missing API key"),
            );
        }
    }
    if protocol == Protocol::Anthropic
        && let Some(refused) = thinking_refusal(&body)
    {
        return error_response(protocol, &failure(400, &refused));
    }
    let Some(turn) = shared.script.lock().unwrap().pop_front() else {
        return error_response(protocol, &failure(400, "fake llm: script exhausted"));
    };
    tokio::time::sleep(turn.delay).await;
    if let Some(failure) = &turn.error {
        if let Some(release) = &turn.hold {
            release.cancelled().await;
        }
        return error_response(protocol, failure);
    }
    let model = body["model"].as_str().unwrap_or("fake-model").to_string();
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let frames = match protocol {
        Protocol::OpenAi => openai_events(&turn, &model, id),
        Protocol::Responses => responses_events(&turn, &model, id),
        Protocol::Anthropic => anthropic_events(&turn, &model, id),
    };
    // The frame with the first piece of text, when there is text.
    let first_text = turn.text.as_ref().and_then(|text| {
        let piece = serde_json::to_string(&pieces(text)[0]).unwrap();
        frames.iter().position(|frame| frame.contains(&piece))
    });
    let cut = first_text.map_or(1, |i| i + 1);
    let mut frames = frames;
    if turn.reset {
        frames.truncate(cut);
    }
    let hold = turn.hold.map(|release| (cut, release));
    stream(shared.clone(), frames, hold, turn.reset)
}

fn failure(status: u16, message: &str) -> Failure {
    Failure {
        status,
        message: message.to_string(),
        retry_after: None,
        retry_after_ms: None,
    }
}

fn error_response(protocol: Protocol, failure: &Failure) -> Response {
    let status = StatusCode::from_u16(failure.status).unwrap();
    let body = match protocol {
        Protocol::OpenAi | Protocol::Responses => {
            json!({"error": {"message": failure.message, "type": "fake_error", "code": null}})
        }
        Protocol::Anthropic => {
            json!({"type": "error", "error": {"type": "fake_error", "message": failure.message}})
        }
    };
    let mut response = (status, axum::Json(body)).into_response();
    let headers = response.headers_mut();
    if let Some(value) = &failure.retry_after {
        headers.insert(header::RETRY_AFTER, value.parse().unwrap());
    }
    if let Some(value) = &failure.retry_after_ms {
        headers.insert("retry-after-ms", value.parse().unwrap());
    }
    response
}

/// Streams the SSE frames; after `hold.0` of them it waits for `hold.1`. It counts the
/// turn completed once the client has taken the last frame, unless `reset`: then it fails
/// the body there, and the server aborts the connection.
fn stream(
    shared: Arc<Shared>,
    frames: Vec<String>,
    hold: Option<(usize, CancellationToken)>,
    reset: bool,
) -> Response {
    struct Feed {
        frames: VecDeque<String>,
        sent: usize,
        hold: Option<(usize, CancellationToken)>,
        reset: bool,
        shared: Arc<Shared>,
    }
    let feed = Feed {
        frames: frames.into(),
        sent: 0,
        hold,
        reset,
        shared,
    };
    let body = futures_util::stream::unfold(feed, |mut feed| async move {
        if let Some((_, release)) = feed.hold.take_if(|(after, _)| *after == feed.sent) {
            release.cancelled().await;
        }
        match feed.frames.pop_front() {
            Some(frame) => {
                feed.sent += 1;
                // A pause between frames so they reach the client as separate reads.
                if feed.sent > 1 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Some((Ok(Bytes::from(frame)), feed))
            }
            None if feed.reset => {
                feed.reset = false;
                // Let what was sent reach the client before the connection goes.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((
                    Err(std::io::Error::other("fake llm: connection reset")),
                    feed,
                ))
            }
            None => {
                feed.shared.completed.fetch_add(1, Ordering::SeqCst);
                None
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap()
}

/// `text` in up to three pieces, cut on character boundaries.
fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(3).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn finish_reason(turn: &Turn) -> &'static str {
    if turn.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn openai_events(turn: &Turn, model: &str, id: usize) -> Vec<String> {
    let chunk = |delta: Value, finish: Option<&str>| {
        let chunk = json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {chunk}\n\n")
    };
    let mut frames = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for piece in turn.text.as_deref().map(pieces).unwrap_or_default() {
        frames.push(chunk(json!({"content": piece}), None));
    }
    for (index, (call_id, name, arguments)) in turn.tool_calls.iter().enumerate() {
        frames.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        for piece in pieces(arguments) {
            frames.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    frames.push(chunk(json!({}), Some(finish_reason(turn))));
    let (prompt, completion, cached) = turn.usage;
    let usage = json!({
        "id": format!("chatcmpl-{id}"),
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    });
    frames.push(format!("data: {usage}\n\n"));
    frames.push("data: [DONE]\n\n".to_string());
    frames
}

/// The Responses API's stream: typed events, each `event: <type>` with its JSON, as
/// OpenAI documents them (output items added, their deltas, done; then the response).
fn responses_events(turn: &Turn, model: &str, id: usize) -> Vec<String> {
    let mut sequence = 0;
    let mut event = |mut data: Value| {
        data["sequence_number"] = sequence.into();
        sequence += 1;
        let kind = data["type"].as_str().unwrap().to_string();
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let response = |status: &str, output: &[Value], usage: Value| {
        json!({"id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000,
               "status": status, "model": model, "output": output, "usage": usage})
    };
    let mut frames = vec![event(json!({"type": "response.created",
        "response": response("in_progress", &[], Value::Null)}))];
    let mut output = Vec::new();
    if let Some(text) = &turn.text {
        let index = output.len();
        let item_id = format!("msg_{id}");
        frames.push(event(
            json!({"type": "response.output_item.added", "output_index": index,
            "item": {"type": "message", "id": item_id, "status": "in_progress",
                     "role": "assistant", "content": []}}),
        ));
        for piece in pieces(text) {
            frames.push(event(
                json!({"type": "response.output_text.delta", "item_id": item_id,
                "output_index": index, "content_index": 0, "delta": piece}),
            ));
        }
        frames.push(event(
            json!({"type": "response.output_text.done", "item_id": item_id,
            "output_index": index, "content_index": 0, "text": text}),
        ));
        let item = json!({"type": "message", "id": item_id, "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]});
        frames.push(event(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": item}),
        ));
        output.push(item);
    }
    for (call_id, name, arguments) in &turn.tool_calls {
        let index = output.len();
        let item_id = format!("fc_{id}_{index}");
        frames.push(event(
            json!({"type": "response.output_item.added", "output_index": index,
            "item": {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
                     "arguments": "", "status": "in_progress"}}),
        ));
        for piece in pieces(arguments) {
            frames.push(event(
                json!({"type": "response.function_call_arguments.delta",
                "item_id": item_id, "output_index": index, "delta": piece}),
            ));
        }
        frames.push(event(
            json!({"type": "response.function_call_arguments.done",
            "item_id": item_id, "output_index": index, "arguments": arguments}),
        ));
        let item = json!({"type": "function_call", "id": item_id, "call_id": call_id,
            "name": name, "arguments": arguments, "status": "completed"});
        frames.push(event(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": item}),
        ));
        output.push(item);
    }
    let (prompt, completion, cached) = turn.usage;
    let usage = json!({"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion});
    frames.push(event(json!({"type": "response.completed",
        "response": response("completed", &output, usage)})));
    frames
}

/// What Anthropic's API refuses of a request with thinking on (its extended-thinking
/// documentation): a budget under 1024 tokens or not below `max_tokens`, and a last
/// assistant turn with tool calls that does not start with its thinking block.
fn thinking_refusal(body: &Value) -> Option<String> {
    if body["thinking"]["type"] != "enabled" {
        return None;
    }
    let budget = body["thinking"]["budget_tokens"].as_u64().unwrap_or(0);
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(0);
    if budget < 1024 || budget >= max_tokens {
        return Some(format!(
            "thinking.budget_tokens: {budget} must be ≥ 1024 and less than max_tokens ({max_tokens})"
        ));
    }
    let messages = body["messages"].as_array()?;
    let last = messages.iter().rev().find(|m| m["role"] == "assistant")?;
    let blocks = last["content"].as_array()?;
    let uses_tools = blocks.iter().any(|b| b["type"] == "tool_use");
    let first = blocks.first().map(|b| b["type"].as_str().unwrap_or(""));
    let thought = matches!(first, Some("thinking" | "redacted_thinking"));
    (uses_tools && !thought).then(|| {
        "messages: Expected `thinking` or `redacted_thinking`, but found `tool_use`. When          `thinking` is enabled, a final `assistant` message must start with a thinking block"
            .to_string()
    })
}

fn anthropic_events(turn: &Turn, model: &str, id: usize) -> Vec<String> {
    let event = |data: Value| {
        let kind = data["type"].as_str().unwrap().to_string();
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let (prompt, completion, cached) = turn.usage;
    let mut frames = vec![event(json!({
        "type": "message_start",
        "message": {
            "id": format!("msg_{id}"), "type": "message", "role": "assistant",
            "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt.saturating_sub(cached),
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
                "output_tokens": 1},
        },
    }))];
    let mut block = 0;
    if let Some((thinking, signature)) = &turn.thinking {
        frames.push(event(json!({"type": "content_block_start", "index": block,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
        for piece in pieces(thinking) {
            frames.push(event(json!({"type": "content_block_delta", "index": block,
                "delta": {"type": "thinking_delta", "thinking": piece}})));
        }
        frames.push(event(json!({"type": "content_block_delta", "index": block,
            "delta": {"type": "signature_delta", "signature": signature}})));
        frames.push(event(json!({"type": "content_block_stop", "index": block})));
        block += 1;
    }
    if let Some(text) = &turn.text {
        frames.push(event(json!({"type": "content_block_start", "index": block,
            "content_block": {"type": "text", "text": ""}})));
        frames.push(event(json!({"type": "ping"})));
        for piece in pieces(text) {
            frames.push(event(json!({"type": "content_block_delta", "index": block,
                "delta": {"type": "text_delta", "text": piece}})));
        }
        frames.push(event(json!({"type": "content_block_stop", "index": block})));
        block += 1;
    }
    for (call_id, name, arguments) in &turn.tool_calls {
        frames.push(event(json!({"type": "content_block_start", "index": block,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}})));
        for piece in pieces(arguments) {
            frames.push(event(json!({"type": "content_block_delta", "index": block,
                "delta": {"type": "input_json_delta", "partial_json": piece}})));
        }
        frames.push(event(json!({"type": "content_block_stop", "index": block})));
        block += 1;
    }
    let stop = if turn.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    frames.push(event(json!({"type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": completion}})));
    frames.push(event(json!({"type": "message_stop"})));
    frames
}
