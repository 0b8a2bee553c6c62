//! Every protocol against the fake LLM the integration tests use (tests/it/support/llm.rs),
//! over real HTTP on loopback.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::agent::{ToolCall, Usage};

#[path = "../../../../tests/it/support/llm.rs"]
#[allow(
    dead_code,
    reason = "the integration tests' fake LLM: these tests use part of it"
)]
mod llm;

use llm::{FakeLlm, Turn};

const KEY: &str = "sk-test-4f1c9a-do-not-leak";

const ALL_APIS: [ChatApi; 3] = [
    ChatApi::OpenAiCompletions,
    ChatApi::OpenAiResponses,
    ChatApi::AnthropicMessages,
];

fn config(llm: &FakeLlm, api: ChatApi) -> ProviderConfig {
    let base_url = match api {
        ChatApi::OpenAiCompletions | ChatApi::OpenAiResponses => llm.openai_base(),
        ChatApi::AnthropicMessages => llm.anthropic_base(),
    };
    ProviderConfig {
        api,
        provider: "fake".into(),
        base_url,
        model: "fake-model-1".into(),
        api_key: Some(Secret::new(KEY.into())),
        headers: vec![("x-team".into(), "keel".into())],
        secret_headers: vec![(
            "x-relay-token".into(),
            Secret::new("relay-secret-77".into()),
        )],
        request_timeout: Duration::from_secs(10),
        max_tokens: None,
        reasoning_effort: None,
        allow_private_addresses: true,
    }
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_secs(5),
    }
}

fn conversation() -> Vec<Message> {
    vec![
        Message::System {
            content: "You are terse.".into(),
        },
        Message::User {
            content: "List the files.".into(),
        },
        Message::Assistant {
            thinking: Vec::new(),
            content: Some("Looking.".into()),
            tool_calls: vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "list_dir".into(),
                    arguments: r#"{"path":"."}"#.into(),
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"README.md"}"#.into(),
                },
            ],
        },
        Message::Tool {
            tool_call_id: "call_a".into(),
            name: "list_dir".into(),
            content: "README.md\nsrc/".into(),
        },
        Message::Tool {
            tool_call_id: "call_b".into(),
            name: "read_file".into(),
            content: "# Keel".into(),
        },
    ]
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "read_file".into(),
        description: "Reads a file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }]
}

/// Runs one call, collecting the deltas.
async fn call(
    client: &ChatClient,
    messages: &[Message],
) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    let mut deltas = Vec::new();
    let result = client
        .complete(messages, &tools(), &mut |d: &str| {
            deltas.push(d.to_string())
        })
        .await;
    (result, deltas)
}

#[tokio::test]
async fn openai_streams_text_deltas_and_reports_usage_with_cached_tokens() {
    let llm = FakeLlm::start(vec![
        Turn::text("The files are README.md and src.").usage(1200, 9, 1024),
    ])
    .await
    .require_key(KEY);
    let client = ChatClient::new(config(&llm, ChatApi::OpenAiCompletions)).unwrap();
    let (result, deltas) = call(&client, &conversation()).await;
    let response = result.unwrap();
    assert!(deltas.len() > 1, "text streams in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "The files are README.md and src.");
    assert_eq!(
        response.message,
        Message::Assistant {
            thinking: Vec::new(),
            content: Some("The files are README.md and src.".into()),
            tool_calls: vec![],
        }
    );
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 1200,
            completion_tokens: 9,
            cached_tokens: 1024
        }
    );
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, "fake-model-1");

    let request = &llm.requests()[0];
    assert_eq!(request.header("x-team"), Some("keel"));
    assert_eq!(request.header("x-relay-token"), Some("relay-secret-77"));
    let body = &request.body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert!(body.get("max_tokens").is_none());
    assert!(
        body.get("reasoning_effort").is_none(),
        "sent only when the task sets one"
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "read_file",
            "description": "Reads a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "call_a", "type": "function",
                    "function": {"name": "list_dir", "arguments": "{\"path\":\".\"}"}},
                {"id": "call_b", "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"README.md\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "README.md\nsrc/"},
            {"role": "tool", "tool_call_id": "call_b", "content": "# Keel"},
        ])
    );
}

#[tokio::test]
async fn openai_assembles_parallel_tool_calls_from_pieces() {
    let llm = FakeLlm::start(vec![
        Turn::tool_call("call_1", "read_file", r#"{"path":"src/main.rs"}"#).and_tool_call(
            "call_2",
            "grep",
            r#"{"pattern":"fn main","glob":"**/*.rs"}"#,
        ),
    ])
    .await;
    let mut config = config(&llm, ChatApi::OpenAiCompletions);
    config.reasoning_effort = Some("low".into());
    let client = ChatClient::new(config).unwrap();
    let (result, deltas) = call(&client, &conversation()[..2]).await;
    let response = result.unwrap();
    assert_eq!(llm.requests()[0].body["reasoning_effort"], "low");
    assert!(deltas.is_empty());
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls(),
        [
            ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"src/main.rs"}"#.into()
            },
            ToolCall {
                id: "call_2".into(),
                name: "grep".into(),
                arguments: r#"{"pattern":"fn main","glob":"**/*.rs"}"#.into()
            },
        ]
    );
    assert_eq!(
        response.message,
        Message::Assistant {
            thinking: Vec::new(),
            content: None,
            tool_calls: response.tool_calls().to_vec()
        }
    );
}

#[tokio::test]
async fn responses_stream_text_and_function_calls_and_map_the_conversation_to_items() {
    let llm = FakeLlm::start(vec![
        Turn::text("Reading both.")
            .and_tool_call("call_1", "read_file", r#"{"path":"src/main.rs"}"#)
            .and_tool_call("call_2", "grep", r#"{"pattern":"fn main"}"#)
            .usage(1500, 30, 1024),
    ])
    .await
    .require_key(KEY);
    let mut config = config(&llm, ChatApi::OpenAiResponses);
    config.max_tokens = Some(256);
    config.reasoning_effort = Some("high".into());
    let client = ChatClient::new(config).unwrap();
    let (result, deltas) = call(&client, &conversation()).await;
    let response = result.unwrap();
    assert!(deltas.len() > 1, "text streams in pieces: {deltas:?}");
    assert_eq!(deltas.concat(), "Reading both.");
    assert_eq!(
        response.message,
        Message::Assistant {
            thinking: Vec::new(),
            content: Some("Reading both.".into()),
            tool_calls: vec![
                ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"src/main.rs"}"#.into()
                },
                ToolCall {
                    id: "call_2".into(),
                    name: "grep".into(),
                    arguments: r#"{"pattern":"fn main"}"#.into()
                },
            ],
        }
    );
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 1500,
            completion_tokens: 30,
            cached_tokens: 1024
        }
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.model, "fake-model-1");

    let request = &llm.requests()[0];
    assert_eq!(request.protocol, llm::Protocol::Responses);
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = &request.body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["store"], false, "nothing kept on the provider's side");
    assert_eq!(body["max_output_tokens"], 256);
    assert_eq!(body["reasoning"], json!({"effort": "high"}));
    assert_eq!(body["instructions"], "You are terse.");
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "name": "read_file", "description": "Reads a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            "strict": false}])
    );
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "Looking."},
            {"type": "function_call", "call_id": "call_a", "name": "list_dir",
                "arguments": "{\"path\":\".\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "read_file",
                "arguments": "{\"path\":\"README.md\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "README.md\nsrc/"},
            {"type": "function_call_output", "call_id": "call_b", "output": "# Keel"},
        ])
    );
}

#[tokio::test]
async fn anthropic_streams_text_and_tool_use_and_maps_the_conversation() {
    let llm = FakeLlm::start(vec![
        Turn::text("Reading it.")
            .and_tool_call("toolu_1", "read_file", r#"{"path":"Cargo.toml"}"#)
            .usage(3000, 40, 2048),
    ])
    .await
    .require_key(KEY);
    let mut config = config(&llm, ChatApi::AnthropicMessages);
    config.max_tokens = Some(256);
    let client = ChatClient::new(config).unwrap();
    let (result, deltas) = call(&client, &conversation()).await;
    let response = result.unwrap();
    assert!(deltas.len() > 1);
    assert_eq!(deltas.concat(), "Reading it.");
    assert_eq!(
        response.message,
        Message::Assistant {
            thinking: Vec::new(),
            content: Some("Reading it.".into()),
            tool_calls: vec![ToolCall {
                id: "toolu_1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"Cargo.toml"}"#.into()
            }],
        }
    );
    // input_tokens (952) + cache_read_input_tokens (2048).
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 3000,
            completion_tokens: 40,
            cached_tokens: 2048
        }
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));

    let request = &llm.requests()[0];
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.header("authorization"), None);
    let body = &request.body;
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["stream"], true);
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(
        body["tools"],
        json!([{"name": "read_file", "description": "Reads a file.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}])
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_a", "name": "list_dir", "input": {"path": "."}},
                {"type": "tool_use", "id": "call_b", "name": "read_file",
                    "input": {"path": "README.md"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "README.md\nsrc/"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "# Keel"},
            ]},
        ])
    );
}

#[tokio::test]
async fn anthropic_thinks_with_the_tasks_effort_and_sends_its_signed_blocks_back() {
    let llm = FakeLlm::start(vec![
        Turn::text("Reading it.")
            .thinking("The manifest first.", "sig-1")
            .and_tool_call("toolu_1", "read_file", r#"{"path":"Cargo.toml"}"#),
        Turn::text("Done."),
        Turn::text("Answered without thinking."),
    ])
    .await
    .require_key(KEY);
    let mut config = config(&llm, ChatApi::AnthropicMessages);
    config.reasoning_effort = Some("high".into());
    let client = ChatClient::new(config).unwrap();
    let mut messages = conversation()[..2].to_vec();
    let (first, deltas) = call(&client, &messages).await;
    let first = first.unwrap();
    assert_eq!(
        deltas.concat(),
        "Reading it.",
        "thinking is not the answer's text"
    );
    let signed =
        json!({"type": "thinking", "thinking": "The manifest first.", "signature": "sig-1"});
    let Message::Assistant { thinking, .. } = &first.message else {
        panic!("{first:?}")
    };
    assert_eq!(thinking, std::slice::from_ref(&signed));
    // The shape a model_call step persists, which a takeover rebuilds from.
    let stored = serde_json::to_value(&first).unwrap();
    assert_eq!(
        serde_json::from_value::<ModelResponse>(stored).unwrap(),
        first
    );

    // Answering its tool call: the turn goes back starting with its signed block (the fake
    // refuses it otherwise, as the API does).
    messages.push(first.message.clone());
    messages.push(Message::Tool {
        tool_call_id: "toolu_1".into(),
        name: "read_file".into(),
        content: "[package]".into(),
    });
    let (second, _) = call(&client, &messages).await;
    assert_eq!(second.unwrap().message.clone(), assistant_text("Done."));
    // A turn whose calls were made without thinking (another provider's): this call does
    // not think rather than being refused.
    let (third, _) = call(&client, &conversation()).await;
    assert_eq!(
        third.unwrap().message,
        assistant_text("Answered without thinking.")
    );

    let requests = llm.requests();
    let budget = json!({"type": "enabled", "budget_tokens": 24576});
    assert_eq!(requests[0].body["thinking"], budget);
    assert_eq!(requests[0].body["max_tokens"], 4096 + 24576);
    assert_eq!(requests[1].body["messages"][1]["content"][0], signed);
    assert!(
        requests[2].body.get("thinking").is_none(),
        "{}",
        requests[2].body
    );
    assert_eq!(requests[2].body["max_tokens"], 4096);
}

fn assistant_text(text: &str) -> Message {
    Message::Assistant {
        content: Some(text.into()),
        tool_calls: Vec::new(),
        thinking: Vec::new(),
    }
}

#[tokio::test]
async fn rate_limits_are_retried_after_the_providers_retry_after() {
    for api in ALL_APIS {
        let llm = FakeLlm::start(vec![
            Turn::error(429, "Rate limit reached").retry_after("1"),
            Turn::error(503, "overloaded").retry_after_ms("20"),
            Turn::text("ok"),
        ])
        .await;
        let client = ChatClient::new(config(&llm, api)).unwrap();
        let started = Instant::now();
        let (response, retries) = complete_with_retry(
            &client,
            &conversation()[..2],
            &[],
            &mut |_: &str| {},
            &fast(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(retries, 2);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "{api:?} waited Retry-After"
        );
        assert_eq!(
            response.message,
            Message::Assistant {
                thinking: Vec::new(),
                content: Some("ok".into()),
                tool_calls: vec![]
            }
        );
        assert_eq!(llm.requests().len(), 3);
        assert_eq!(llm.completed(), 1);
    }
}

#[tokio::test]
async fn a_refused_request_is_fatal_with_the_providers_message_and_no_secret() {
    for api in ALL_APIS {
        let echo = format!("Incorrect API key provided: {KEY} (relay relay-secret-77)");
        let llm = FakeLlm::start(vec![Turn::error(400, &echo)]).await;
        let client = ChatClient::new(config(&llm, api)).unwrap();
        let outcome = complete_with_retry(
            &client,
            &conversation()[..2],
            &[],
            &mut |_: &str| {},
            &fast(),
            &CancellationToken::new(),
        )
        .await;
        let Err(ProviderError::Fatal { status, message }) = outcome else {
            panic!("{api:?}: {outcome:?}");
        };
        assert_eq!(status, Some(400));
        assert_eq!(
            message,
            "fake answered HTTP 400: Incorrect API key provided: [redacted] (relay [redacted])"
        );
        assert_eq!(llm.requests().len(), 1, "a fatal error is not retried");
    }
}

#[tokio::test]
async fn a_reset_mid_stream_is_retried() {
    for api in ALL_APIS {
        let llm = FakeLlm::start(vec![
            Turn::text("half an answer").reset_mid_stream(),
            Turn::text("a whole answer"),
        ])
        .await;
        let client = ChatClient::new(config(&llm, api)).unwrap();
        let mut text = String::new();
        let (response, retries) = complete_with_retry(
            &client,
            &conversation()[..2],
            &[],
            &mut |d: &str| text.push_str(d),
            &fast(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(retries, 1, "{api:?}");
        assert_eq!(
            response.message,
            Message::Assistant {
                thinking: Vec::new(),
                content: Some("a whole answer".into()),
                tool_calls: vec![]
            }
        );
        // The failed try's first piece streamed before the retry's whole text.
        assert!(text.ends_with("a whole answer") && text.len() > "a whole answer".len());
        assert_eq!(llm.completed(), 1);
    }
}

#[tokio::test]
async fn an_unreadable_stream_is_fatal() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_string("data: {\"choices\": [oops\n\n"),
        )
        .mount(&server)
        .await;
    let mut config = config(&FakeLlm::start(vec![]).await, ChatApi::OpenAiCompletions);
    config.base_url = format!("{}/v1", server.uri());
    let client = ChatClient::new(config).unwrap();
    let (result, _) = call(&client, &conversation()[..2]).await;
    assert!(
        matches!(&result, Err(ProviderError::Fatal { status: None, message })
            if message.contains("unreadable chunk")),
        "{result:?}"
    );
}

#[tokio::test]
async fn an_error_event_mid_stream_is_transient_when_the_provider_is_overloaded() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let events = |error_type: &str| {
        format!(
            "event: message_start\ndata: {}\n\nevent: error\ndata: {}\n\n",
            json!({"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 3}}}),
            json!({"type": "error", "error": {"type": error_type, "message": "try later"}}),
        )
    };
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(ResponseTemplate::new(200).set_body_string(events("overloaded_error")))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(ResponseTemplate::new(200).set_body_string(events("invalid_request_error")))
        .mount(&server)
        .await;
    let mut config = config(&FakeLlm::start(vec![]).await, ChatApi::AnthropicMessages);
    config.base_url = server.uri();
    let client = ChatClient::new(config).unwrap();
    let (overloaded, _) = call(&client, &conversation()[..2]).await;
    assert_eq!(
        overloaded,
        Err(ProviderError::Transient {
            message: "the provider failed mid-stream: overloaded_error: try later".into(),
            retry_after: None
        })
    );
    let (invalid, _) = call(&client, &conversation()[..2]).await;
    assert!(
        matches!(invalid, Err(ProviderError::Fatal { .. })),
        "{invalid:?}"
    );
}

#[tokio::test]
async fn retries_give_up_with_the_last_transient_error() {
    let llm = FakeLlm::start(vec![
        Turn::error(500, "boom"),
        Turn::error(502, "still boom"),
    ])
    .await;
    let client = ChatClient::new(config(&llm, ChatApi::OpenAiCompletions)).unwrap();
    let policy = RetryPolicy {
        max_retries: 1,
        ..fast()
    };
    let outcome = complete_with_retry(
        &client,
        &conversation()[..2],
        &[],
        &mut |_: &str| {},
        &policy,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        outcome,
        Err(ProviderError::Transient {
            message: "fake answered HTTP 502: still boom".into(),
            retry_after: None
        })
    );
}

#[tokio::test]
async fn a_call_slower_than_the_timeout_is_transient() {
    let llm = FakeLlm::start(vec![Turn::text("late").delay(Duration::from_secs(5))]).await;
    let mut config = config(&llm, ChatApi::OpenAiCompletions);
    config.request_timeout = Duration::from_millis(200);
    let client = ChatClient::new(config).unwrap();
    let (result, _) = call(&client, &conversation()[..2]).await;
    assert!(
        matches!(&result, Err(ProviderError::Transient { message, .. }) if message.contains("timed out")),
        "{result:?}"
    );
}

#[tokio::test]
async fn cancellation_mid_stream_interrupts_the_call() {
    for api in ALL_APIS {
        let release = CancellationToken::new();
        let llm = FakeLlm::start(vec![
            Turn::text("a long answer that never ends").hold(release.clone()),
        ])
        .await;
        let client = ChatClient::new(config(&llm, api)).unwrap();
        let cancel = CancellationToken::new();
        let seen = Arc::new(Mutex::new(String::new()));
        let on_delta_seen = seen.clone();
        let cancel_on_delta = cancel.clone();
        // Cancel once the first piece of text has arrived: the call is mid-stream.
        let mut on_delta = move |d: &str| {
            on_delta_seen.lock().unwrap().push_str(d);
            cancel_on_delta.cancel();
        };
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            complete_with_retry(
                &client,
                &conversation()[..2],
                &[],
                &mut on_delta,
                &fast(),
                &cancel,
            ),
        )
        .await
        .expect("the cancelled call returns promptly");
        assert_eq!(outcome, Err(ProviderError::Interrupted), "{api:?}");
        assert!(!seen.lock().unwrap().is_empty());
        release.cancel();
        assert_eq!(llm.completed(), 0);
    }
}

#[tokio::test]
async fn private_addresses_are_refused_unless_allowed() {
    let llm = FakeLlm::start(vec![Turn::text("unreachable")]).await;
    let mut literal = config(&llm, ChatApi::OpenAiCompletions);
    literal.allow_private_addresses = false;
    let Err(ProviderError::Fatal { message, .. }) = ChatClient::new(literal.clone()) else {
        panic!("a loopback literal is refused up front");
    };
    assert!(
        message.contains("127.0.0.1 is not a public address"),
        "{message}"
    );

    // A name is checked when it resolves.
    let port = llm.url.rsplit(':').next().unwrap();
    literal.base_url = format!("http://localhost:{port}/v1");
    let client = ChatClient::new(literal).unwrap();
    let (result, _) = call(&client, &conversation()[..2]).await;
    let Err(ProviderError::Fatal { message, .. }) = result else {
        panic!("{result:?}");
    };
    assert!(
        message.contains("resolves to no public address"),
        "{message}"
    );
    assert!(llm.requests().is_empty());
}

#[test]
fn retry_after_reads_milliseconds_seconds_and_dates() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let headers = |pairs: &[(&'static str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    };
    assert_eq!(
        retry_after(&headers(&[("retry-after", "7")]), now),
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        retry_after(
            &headers(&[("retry-after", "7"), ("retry-after-ms", "1500")]),
            now
        ),
        Some(Duration::from_millis(1500))
    );
    let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
    assert_eq!(
        retry_after(&headers(&[("retry-after", &date)]), now),
        Some(Duration::from_secs(30))
    );
    let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
    assert_eq!(
        retry_after(&headers(&[("retry-after", &past)]), now),
        Some(Duration::ZERO)
    );
    assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
}

#[test]
fn error_bodies_yield_their_message() {
    assert_eq!(
        error_message(r#"{"error":{"message":"bad model","type":"x"}}"#),
        "bad model"
    );
    assert_eq!(
        error_message(
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: required"}}"#
        ),
        "max_tokens: required"
    );
    assert_eq!(
        error_message("<html>gateway</html>"),
        "<html>gateway</html>"
    );
}
